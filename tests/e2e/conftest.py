"""Fixtures for the tests that drive a real containerd.

- ``pause_image`` (session): the static pause image archive (built once into .cache/).
- ``cri_modules`` (session): the compiled CRI proto (into .cache/cri/).
- ``make_containerd(**kwargs)``: starts a private containerd (see
  tests/support/containerd.py for the arguments; ``cni_bin_dirs`` defaults to the Debian CNI
  plugins, ``start=False`` returns it unstarted). Every instance is cleaned up after the test;
  when the test failed, the tail of its log is printed.
- ``make_crio(**kwargs)``: the same for a private CRI-O (tests/support/crio.py). Its tests,
  ``test_crio_*.py`` and the ``[crio]`` cases of tests written for both runtimes, are always
  collected: without CRI-O they fail, unless ``NRI_CNI_NO_CRIO=1`` leaves them out (the run
  ends with their count). With ``NRI_CNI_CRIO_REPORT=FILE`` the run writes how many each file
  collected and how many passed, failed, were skipped, deselected or left out (.ci/run fails
  unless every collected one passed, or they were left out on purpose).
- ``make_bridge_network(**kwargs)`` / ``bridge_network``: a bridge + host-local + portmap CNI
  conf dir (nctbr0, 10.246.0.0/24 by default) whose host-side traces are removed afterwards.
  Request it BEFORE ``make_containerd`` so that containerd's pods are gone first.
- ``shim_node``: nri-cni in shim mode beside a private containerd (tests/support/shimnode.py).
- ``make_secondary_node(subnets)``: containerd's CNI for eth0, nri-cni in secondary mode for net1
  (tests/support/secondarynode.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from tests.support import crio as crio_support  # noqa: E402
from tests.support.containerd import Containerd, cni_plugin_dir  # noqa: E402
from tests.support.cri import CriModules, compile_cri  # noqa: E402
from tests.support.hostnet import BridgeNetwork  # noqa: E402
from tests.support.pause.image import PauseImage, build_pause_image  # noqa: E402
from tests.support.secondarynode import SecondaryNode, secondary_nodes  # noqa: E402
from tests.support.shimnode import shim_node as _shim_node  # noqa: E402

_crio_tally = crio_support.Tally()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if crio_support.is_crio_test(item.nodeid):
            item.add_marker(pytest.mark.crio)
    out = _crio_tally.collected(items)
    if out:
        items[:] = [i for i in items if i not in out]
        config.hook.pytest_deselected(items=out)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    line = _crio_tally.summary()
    if line:
        terminalreporter.write_line(line, yellow=True)


def pytest_deselected(items: list[pytest.Item]) -> None:
    _crio_tally.deselected(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _crio_tally.report(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _crio_tally.write()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"_nct_rep_{report.when}", report)


def _test_failed(node: pytest.Item) -> bool:
    return any(
        getattr(getattr(node, f"_nct_rep_{when}", None), "failed", False) for when in ("setup", "call")
    )


@pytest.fixture(scope="session")
def pause_image() -> PauseImage:
    return build_pause_image()


@pytest.fixture(scope="session")
def cri_modules() -> CriModules:
    return compile_cri()


def _runtimes(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    pause_image: PauseImage,
    cls: type[Containerd] | type[crio_support.Crio],
) -> Iterator[Callable[..., Any]]:
    """A factory of private runtime instances of `cls`, each cleaned up after the test (the
    tail of its log printed when the test failed)."""
    instances: list[Any] = []

    def factory(*, start: bool = True, **kwargs: Any) -> Any:
        kwargs.setdefault("cni_bin_dirs", [cni_plugin_dir()])
        kwargs.setdefault("pause", pause_image)
        inst = cls(tmp_path_factory.mktemp(cls.name), **kwargs)
        instances.append(inst)
        if start:
            inst.start()
        return inst

    yield factory

    problems: list[str] = []
    failed = _test_failed(request.node)
    for inst in reversed(instances):
        if failed:
            print(f"\n---- tail of {inst.log_path}\n{inst.log_tail()}")
        problems += inst.cleanup()
    if problems:
        pytest.fail(f"{cls.name} cleanup left problems:\n  " + "\n  ".join(problems))


@pytest.fixture
def make_containerd(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    pause_image: PauseImage,
    cri_modules: CriModules,
) -> Iterator[Callable[..., Containerd]]:
    yield from _runtimes(request, tmp_path_factory, pause_image, Containerd)


@pytest.fixture
def make_crio(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    pause_image: PauseImage,
    cri_modules: CriModules,
) -> Iterator[Callable[..., crio_support.Crio]]:
    yield from _runtimes(request, tmp_path_factory, pause_image, crio_support.Crio)


@pytest.fixture
def make_bridge_network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., BridgeNetwork]]:
    nets: list[BridgeNetwork] = []

    def factory(**kwargs: Any) -> BridgeNetwork:
        net = BridgeNetwork(tmp_path_factory.mktemp("cni"), **kwargs)
        nets.append(net)
        return net

    yield factory

    problems: list[str] = []
    for net in reversed(nets):
        problems += net.cleanup()
    if problems:
        pytest.fail("network cleanup left problems:\n  " + "\n  ".join(problems))


@pytest.fixture
def bridge_network(make_bridge_network: Callable[..., BridgeNetwork]) -> BridgeNetwork:
    return make_bridge_network()


@pytest.fixture
def shim_node(tmp_path: Path, make_containerd: Callable[..., Containerd]) -> Iterator[Any]:
    with _shim_node(tmp_path, make_containerd) as node:
        yield node


@pytest.fixture
def make_secondary_node(
    tmp_path: Path,
    make_bridge_network: Callable[..., BridgeNetwork],
    make_containerd: Callable[..., Containerd],
) -> Iterator[Callable[[tuple[str, str]], SecondaryNode]]:
    # make_bridge_network before make_containerd: containerd's pods are gone before its network
    with secondary_nodes(tmp_path, make_bridge_network, make_containerd) as factory:
        yield factory
