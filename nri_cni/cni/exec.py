"""Running one CNI plugin binary: libcni's pkg/invoke, built for a low per-call cost.

asyncio's subprocess support starts a watcher thread per child on Python 3.11 and wraps every
pipe in a transport; a CNI call needs none of that, and on a busy node every bit of the
daemon's CPU is taken from the plugins it runs. Here a plugin is started with os.posix_spawn
(glibc's clone(CLONE_VFORK) path) in its own process group. Its stdin is a memory file (memfd)
holding the config, read to EOF as from a pipe; stdout and stderr are pipes. The event loop
watches a pidfd and, in the common case, wakes once: at the exit, when the output sits in the
pipes and is read there. A plugin still running after DRAIN_AFTER gets its pipes read as it
writes, so that output bigger than a pipe holds never blocks it for longer. A timeout kills the
whole group.

The exit, not EOF, ends a call: a helper the plugin left running with our stdout cannot hold
the call open (with libcni it does). stdout is bounded (MAX_STDOUT: the plugin is killed past
it); of stderr the tail is kept.
"""

import asyncio
import contextlib
import errno
import logging
import os
import stat
from collections.abc import Iterable

from nri_cni.cni.exec_errors import Ended, PluginOutput, excerpt, outcome
from nri_cni.cni.executor import check_name
from nri_cni.cni.plugin_process import STDERR_TAIL, ChildRun
from nri_cni.errors import PluginNotRun, PluginRef, PluginTimeout
from nri_cni.safety import files

# re-exported: callers and tests import these from here
__all__ = ["STDERR_TAIL", "PluginExecutor", "PluginOutput", "excerpt"]

log = logging.getLogger(__name__)

ETXTBSY_RETRIES = 5  # libcni retries "text file busy" 5 times (1 s apart; we back off faster)


class PluginExecutor:
    """Finds and runs plugin binaries. Stateless; one instance serves many calls at once.

    trust_files: a binary (or its directory) another user can write, or owns, is refused
    (files.trust_problem); False only warns (files.trust: warn)."""

    def __init__(self, *, trust_files: bool = True) -> None:
        self.trust_files = trust_files
        # path -> what the trust check saw when it passed, and where a link led: the binary
        # and its directory; for a link, the link, the file it resolves to, the link's
        # directory and the file's. The same inodes unchanged (ctime moves with any chmod,
        # chown, rename or write; a link re-pointed leads to another file) pass again, for a
        # few stats instead of the check's and its path walk (a link's realpath: an lstat per
        # component, 0.1 ms a plugin cold)
        self._trusted: dict[str, tuple[tuple[int, ...], str]] = {}

    def find(self, plugin_type: str, bin_dirs: Iterable[str]) -> str:
        """The first regular file named `plugin_type` in `bin_dirs`."""
        check_name(plugin_type)
        dirs = list(bin_dirs)
        for d in dirs:
            path = os.path.join(d, plugin_type)
            known, known_real = self._trusted.get(path, (_NOTHING, ""))
            try:
                st = os.lstat(path)
                real = ""
                if stat.S_ISLNK(st.st_mode):
                    link, st = st, os.stat(path)
                    here = (link, st, os.stat(d))
                    real, seen = known_real, _NOTHING
                    if known_real:  # where it led when it passed
                        with contextlib.suppress(OSError):
                            seen = _identity(*here, os.stat(os.path.dirname(known_real)))
                    if not known_real or seen != known:  # never passed, or it may lead elsewhere now
                        real = os.path.realpath(path)
                        seen = _identity(*here, os.stat(os.path.dirname(real)))
                else:
                    seen = _identity(st, os.stat(d))
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if seen == known:
                return path
            if not files.trust_problem(path, executable=True):
                self._trusted[path] = (seen, real)  # as seen before the check: a change since misses
                return path
            problem = files.check_trusted(path, enforce=self.trust_files, what="plugin", executable=True)
            if problem:
                raise PluginNotRun(
                    f"cannot run plugin {plugin_type!r}: not trusted: {problem} (files.trust: warn allows it)",
                    ref=PluginRef(plugin=plugin_type),
                )
            return path
        raise PluginNotRun(
            f"failed to find plugin {plugin_type!r} in path {dirs}", ref=PluginRef(plugin=plugin_type)
        )

    async def exec(self, plugin_path: str, env: dict[str, str], stdin: bytes, timeout: float) -> bytes:
        """Runs the plugin; returns its stdout on exit 0 (possibly empty).

        Raises CNIError when it printed a CNI error object and failed, PluginTimeout when it
        was killed at `timeout`, PluginExecError for anything else (cannot start, crash,
        garbage, output over MAX_STDOUT).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        run = ChildRun(loop, stdin)
        try:
            for attempt in range(ETXTBSY_RETRIES + 1):
                try:
                    run.spawn(plugin_path, env)
                    break
                except OSError as exc:
                    # a plugin binary being replaced right now; libcni retries the same way
                    if exc.errno != errno.ETXTBSY or attempt == ETXTBSY_RETRIES:
                        raise PluginNotRun(
                            f"cannot run plugin {plugin_path}: {exc.strerror}", ref=_ref(plugin_path, env)
                        ) from None
                    await asyncio.sleep(min(0.05 * 2**attempt, max(0.0, deadline - loop.time())))
                    if loop.time() >= deadline:
                        raise PluginTimeout(
                            f"plugin {plugin_path} stayed busy (ETXTBSY) for {timeout}s",
                            ref=_ref(plugin_path, env),
                        ) from None
                except ValueError as exc:  # NUL in an env value or argument
                    raise PluginNotRun(
                        f"cannot run plugin {plugin_path}: {exc}", ref=_ref(plugin_path, env)
                    ) from None
            run.start_timer(deadline)
            try:
                await run.done
            finally:
                if run.timer is not None:
                    run.timer.cancel()
        except BaseException:
            run.abandon()
            raise
        ended = Ended(
            stdout=run.stdout[0] if len(run.stdout) == 1 else b"".join(run.stdout),
            stderr=bytes(run.stderr[-STDERR_TAIL:]),
            status=run.status,
            timed_out=run.timed_out,
            overflow=run.overflow,
        )
        out = outcome(ended, plugin_path, _ref(plugin_path, env), timeout)
        if out.stderr:
            log.debug(
                "plugin %s %s stderr: %s",
                plugin_path,
                env.get("CNI_COMMAND"),
                out.stderr.decode(errors="replace"),
            )
        return out


_NOTHING: tuple[int, ...] = ()  # what no file is seen as


def _identity(*stats: os.stat_result) -> tuple[int, ...]:
    return tuple(
        x for st in stats for x in (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_ctime_ns)
    )


def _ref(plugin_path: str, env: dict[str, str]) -> PluginRef:
    return PluginRef(plugin=os.path.basename(plugin_path), command=env.get("CNI_COMMAND", ""))
