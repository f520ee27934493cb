"""The mutation tool's runners (mutmut's) fork each mutant's test run from a process that has
run the unit tests already. What tests/support keeps for the whole process must work in such a
child: the pod plans' shared netns pool (tests/support/pods.py) has no threads there, and a
plan that used it waited forever on the answer's MAC and MTU, so every mutant those tests
reach ended as a timeout, which the tool counts as killed, whatever the mutant changed."""

from __future__ import annotations

import os

from nri_cni.cni.executor import FakeExecutor
from nri_cni.cni.runtime import CNIRuntime
from nri_cni.config import parse_config
from tests.support.pods import pod_plan


def _plan(tmp_path):
    doc = {
        "state_dir": str(tmp_path / "state"),
        "networks": [
            {
                "name": "podnet",
                "default": True,
                "conflist": {"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "f-br"}]},
            }
        ],
    }
    cfg = parse_config(doc, str(tmp_path / "config.yaml"))
    return pod_plan(cfg, CNIRuntime(["/fake-bin"], str(tmp_path / "cache"), executor=FakeExecutor({})))


def test_a_forked_child_gets_a_netns_pool_with_threads_of_its_own(tmp_path):
    parents = _plan(tmp_path).attacher.inspector
    # its workers run here: a job ends (as root with the pid; as nobody, whose workers cannot
    # enter the daemon's netns, with StrandedWorker), it never waits
    parents._pool.submit(os.getpid).exception()
    assert _plan(tmp_path).attacher.inspector is parents  # control: one pool for the process
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but os.write and os._exit may end it
        verdict = b"?"
        try:
            mine = _plan(tmp_path).attacher.inspector
            if mine is parents:
                verdict = b"the parent's pool"
            else:
                mine._pool.submit(os.getpid).exception()  # ends, as in the parent
                verdict = b"ok"
        except BaseException as exc:  # reported to the parent
            verdict = repr(exc).encode()
        finally:
            os.write(w, verdict)
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        verdict = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert verdict == b"ok"
