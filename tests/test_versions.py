"""Releases known not to run are named at import in one line with what to do (setup.cfg
bounds nothing from above): a torch too old, dgl 2.x on a torch its graphbolt was not built
for."""

from __future__ import annotations

import pytest

from instrumented_convs.core.native import versions

from .helpers import run_script


def test_versions_compare_as_numbers():
    assert versions.key("2.14.1+cu130") == (2, 14, 1) > versions.key("2.2") == (2, 2)
    assert versions.key("2.10.0") > versions.key("2.9.1") and versions.key("1.1.3") < (2,)


@pytest.mark.parametrize("found", ["2.1.2", "1.13.1+cpu"])
def test_a_torch_too_old_is_named_with_what_to_do(found):
    with pytest.raises(ImportError) as info:
        versions.require(found)
    assert str(info.value) == (
        f"instrumented_convs needs torch 2.2 or newer, this is torch {found}: "
        "pip install 'torch>=2.2'"
    )


@pytest.mark.parametrize("found", ["2.2.0", "2.14.1+cu130", "2.15.0", "3.0.0"])
def test_every_torch_from_the_oldest_up_imports(found):
    versions.require(found)  # nothing raised: no upper bound


def test_the_package_itself_checks_torch_at_import():
    code = (
        "import torch; torch.__version__ = '2.1.2'\n"
        "try:\n    import instrumented_convs\nexcept ImportError as e:\n    print(e)\n"
    )
    out = run_script("-c", code).stdout.strip()
    assert out == "instrumented_convs needs torch 2.2 or newer, this is torch 2.1.2: " + (
        "pip install 'torch>=2.2'"
    )


#: What ``import dgl`` raised with dgl 2.1.0 on torch 2.14.1 (seen on this machine): the
#: newest torchdata without datapipes, then with torchdata 0.7.1 the missing library.
DGL_21_ERRORS = [
    ModuleNotFoundError("No module named 'torchdata.datapipes'"),
    FileNotFoundError(
        "Cannot find DGL C++ graphbolt library at .../dgl/graphbolt/libgraphbolt_pytorch_2.14.1.so"
    ),
]


@pytest.mark.parametrize("exc", DGL_21_ERRORS, ids=["torchdata", "library"])
def test_dgl_2_on_another_torch_is_one_line_naming_both_and_what_to_do(exc):
    line = versions.dgl_import_error(exc, "2.1.0", "2.14.1+cu130")
    assert line == (
        "dgl 2.1.0 cannot load on torch 2.14.1+cu130 (its graphbolt library is built for "
        "torch 2.0 to 2.2, with torchdata<0.10): pip install 'dgl==1.1.3', which runs on "
        "this torch"
    )


def test_other_dgl_failures_are_left_as_they_are():
    missing = ModuleNotFoundError("No module named 'scipy'")
    assert versions.dgl_import_error(missing, "1.1.3", "2.14.1") is None  # dgl 1.x: any torch
    assert versions.dgl_import_error(missing, "2.1.0", "2.2.1") is None  # its own torch
    assert versions.dgl_import_error(missing, None, "2.14.1") is None  # no dgl installed
    assert versions.dgl_import_error(DGL_21_ERRORS[0], "2.1.0", "2.2.1") is not None
