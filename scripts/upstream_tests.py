"""Run upstream's own tests of the most used conv layers with our classes swapped in.

    python scripts/upstream_tests.py pyg|dgl [--source SRC] [--layers gcn,sage] [--keep] [-- ARGS]

The files: no registry has them (PyPI's torch_geometric sdist holds the package only, DGL ships
wheels only; ``torch_geometric.testing`` is in the wheel), so ``--source`` gives upstream's
repository once: a git directory (bare mirror or clone, read at tag ``X.Y.Z`` or ``vX.Y.Z`` of
the installed version), a tarball with one top folder (GitHub's tag archive, e.g.
``github.com/dmlc/dgl/archive/refs/tags/v1.1.3.tar.gz``) or a checkout (version unchecked).
They are cached in ``$INSTRUMENTED_CONVS_CACHE/upstream/<pyg|dgl>-<version>/`` (default
``~/.cache/instrumented_convs``) for later runs; CI restores that folder from its own cache.

pytest runs on a temporary copy with this module as a plugin (``-p``, imported before any test
module): in ``torch_geometric.nn[.conv]`` (``dgl.nn[.pytorch[.conv]]``) it swaps in each class of
``instrumented_convs.pyg`` (``.dgl``) that subclasses the stock class of its name, and fails the
run unless each class of the chosen layers was built and ran an instrumented forward (registry
rows). A ``-k`` in ARGS replaces the table's (DGL's tests share one file).
"""

import argparse
import collections
import functools
import importlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version as dist_version
from pathlib import Path

logger = logging.getLogger("upstream_tests")
NN = "tests/python/pytorch/nn/test_nn.py"
# layer: (test file, pytest -k expression or None, the classes it tests)
TABLE = {
    "pyg": {
        "gcn": ("test/nn/conv/test_gcn_conv.py", None, ["GCNConv"]),
        "sage": ("test/nn/conv/test_sage_conv.py", None, ["SAGEConv"]),
        "gat": ("test/nn/conv/test_gat_conv.py", None, ["GATConv"]),
        "gin": ("test/nn/conv/test_gin_conv.py", None, ["GINConv"]),
        "graph_conv": ("test/nn/conv/test_graph_conv.py", None, ["GraphConv"]),
    },
    "dgl": {
        "graph_conv": (NN, "test_graph_conv", ["GraphConv", "EdgeWeightNorm"]),
        "sage": (NN, "test_sage_conv", ["SAGEConv"]),
        "gat": (NN, "test_gat_conv", ["GATConv"]),
        "gin": (NN, "test_gin_conv", ["GINConv"]),
    },
}
# What the test files need besides themselves (copied where present).
SUPPORT = {"pyg": ["test/conftest.py"], "dgl": ["tests/backend", "tests/utils", "tests/test_utils"]}
TARGETS = {
    "pyg": ["torch_geometric.nn", "torch_geometric.nn.conv"],
    "dgl": ["dgl.nn", "dgl.nn.pytorch", "dgl.nn.pytorch.conv"],
}
ENV_FW, ENV_REQUIRE = "IC_UPSTREAM_FW", "IC_UPSTREAM_REQUIRE"


def swappable(fw):
    """{name: (our class, [modules whose `name` is a stock class that ours subclasses])}."""
    ours, found = importlib.import_module("instrumented_convs." + fw), {}
    for name in ours.__all__:
        cls = getattr(ours, name)
        mods = [
            m
            for m in map(importlib.import_module, TARGETS[fw])
            if isinstance(cls, type)
            and isinstance(getattr(m, name, None), type)
            and getattr(m, name) is not cls
            and issubclass(cls, getattr(m, name))
        ]
        if mods:
            found[name] = (cls, mods)
    return found


# -- the pytest plugin (this module, as pytest imports it in the subprocess) ------------------
BUILT = collections.Counter()


def _counting(name, init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        BUILT[name] += 1
        init(self, *args, **kwargs)

    return __init__


def _install(fw):
    for name, (cls, mods) in swappable(fw).items():
        cls.__init__ = _counting(name, cls.__init__)
        for mod in mods:
            setattr(mod, name, cls)
        BUILT[name] += 0


def _forwards(name):
    from instrumented_convs import registry

    return sum(
        r.count + r.untimed
        for r in registry.summary()
        if r.step == name and r.depth == 0 and r.phase == "forward"
    )


def pytest_sessionfinish(session, exitstatus):
    required = [n for n in os.environ.get(ENV_REQUIRE, "").split(",") if n]
    session.config._ic_missing = [n for n in required if not BUILT[n] or not _forwards(n)]
    if session.config._ic_missing and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    out, required = terminalreporter, os.environ.get(ENV_REQUIRE, "").split(",")
    out.section("instrumented_convs swap")
    for name in sorted(n for n in BUILT if BUILT[n] or n in required):
        out.line(f"{name}: {BUILT[name]} built, {_forwards(name)} instrumented forwards")
    out.line(f"({len(BUILT)} classes swapped in; the others unused here)")
    for name in getattr(config, "_ic_missing", []):
        out.line(f"FAIL: {name} was swapped in but never built or run", red=True)


if os.environ.get(ENV_FW) and __name__ != "__main__":
    _install(os.environ[ENV_FW])


# -- the runner -------------------------------------------------------------------------------
def _extract(tar, dest, prefixes, strip):  # the files under `prefixes`, `strip` parts dropped
    for member in tar.getmembers():
        parts = member.name.split("/")[strip:]
        rel = "/".join(parts)
        if (
            member.isfile()
            and ".." not in parts
            and any(rel == p or rel.startswith(p + "/") for p in prefixes)
        ):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(tar.extractfile(member).read())


def materialize(fw, ver, source, tag=None):
    """The cache folder with upstream's test files for `fw` at `ver` (filled from `source`)."""
    cache = os.environ.get("INSTRUMENTED_CONVS_CACHE", Path.home() / ".cache/instrumented_convs")
    dest = Path(cache) / "upstream" / f"{fw}-{ver}"
    if source is None:
        if not (dest / ".complete").exists():
            sys.exit(f"no upstream {fw} {ver} tests in {dest}: run once with --source (--help)")
        return dest
    src, tmp = Path(source), dest.with_name(dest.name + ".building")
    tests = sorted({entry[0] for entry in TABLE[fw].values()})
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if (src / "HEAD").is_file() and (src / "objects").is_dir():
        tops = sorted({p.split("/")[0] for p in tests + SUPPORT[fw]})
        for ref in (tag,) if tag else (ver, "v" + ver):
            run = subprocess.run(
                ["git", "--git-dir", str(src), "archive", "--format=tar", ref, "--", *tops],
                capture_output=True,
            )
            if run.returncode == 0:
                logger.info("reading %s at tag %s", src, ref)
                _extract(tarfile.open(fileobj=io.BytesIO(run.stdout)), tmp, tests + SUPPORT[fw], 0)
                break
        else:
            shutil.rmtree(tmp)
            sys.exit(f"{src} has no tag {tag or ver + ' or v' + ver}")
    elif src.is_dir():
        logger.warning("copying from the folder %s: make sure it is at version %s", src, ver)
        for p in [p for p in tests + SUPPORT[fw] if (src / p).exists()]:
            (tmp / p).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (src / p).is_dir() else shutil.copy2)(src / p, tmp / p)
    else:
        with tarfile.open(src) as tar:
            if ver not in tar.getmembers()[0].name.split("/")[0]:
                logger.warning("the top folder of %s does not name version %s", src, ver)
            _extract(tar, tmp, tests + SUPPORT[fw], 1)
    found = [t for t in tests if (tmp / t).is_file()]
    if not found:
        shutil.rmtree(tmp)
        sys.exit(f"{source} holds none of {tests}")
    (tmp / ".complete").touch()
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    logger.info("cached %s in %s", ", ".join(found), dest)
    return dest


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("framework", choices=sorted(TABLE))
    parser.add_argument("--source", help="git directory, tarball or folder with upstream's tests")
    parser.add_argument(
        "--layers",
        help="comma-separated, of "
        + "; ".join(f"{fw}: {', '.join(layers)}" for fw, layers in TABLE.items())
        + " (default: all)",
    )
    parser.add_argument(
        "--tag",
        help="the tag to read from a git --source (default: the installed "
        "version; PyG 2.8.1's tests are tagged 2.8.0)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--check-cache",
        action="store_true",
        help="only say (exit status 0/1) whether the files are cached for this version",
    )
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    logging.basicConfig(level=logging.INFO, format="upstream_tests: %(message)s")
    fw = args.framework
    layers = args.layers.split(",") if args.layers else list(TABLE[fw])
    if set(layers) - set(TABLE[fw]):
        parser.error(f"unknown layers {sorted(set(layers) - set(TABLE[fw]))}")
    os.environ.setdefault("DGLBACKEND", "pytorch")
    ver = dist_version({"pyg": "torch_geometric"}.get(fw, fw)).split("+")[0]
    if args.check_cache:
        cache_root = os.environ.get(
            "INSTRUMENTED_CONVS_CACHE", Path.home() / ".cache/instrumented_convs"
        )
        return 0 if (Path(cache_root) / "upstream" / f"{fw}-{ver}" / ".complete").exists() else 1
    cache = materialize(fw, ver, args.source, args.tag)
    ours = swappable(fw)
    logger.info("%s %s: swapping in %d classes: %s", fw, ver, len(ours), ", ".join(sorted(ours)))
    files, keywords, required = [], [], []
    for layer in layers:
        path, keyword, classes = TABLE[fw][layer]
        lacking = [c for c in classes if c not in ours]
        if lacking or not (cache / path).is_file():
            logger.warning(
                "skipping %s: %s",
                layer,
                f"instrumented_convs.{fw} lacks {lacking}"
                if lacking
                else f"upstream {ver} has no {path}",
            )
            continue
        files += [] if path in files else [path]
        keywords += [keyword] if keyword else []
        required += classes
    if not files:
        logger.error("no layer to test")
        return 2
    work = Path(tempfile.mkdtemp(prefix=f"upstream-{fw}-"))
    shutil.copytree(cache, work / "upstream", ignore=shutil.ignore_patterns(".complete"))
    (work / "pytest.ini").write_text("[pytest]\n")  # keeps any enclosing project's config out
    root = Path(__file__).resolve().parents[1]
    paths = [root / "scripts", root, work / "upstream" / "tests", os.environ.get("PYTHONPATH")]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(str(p) for p in paths if p),
        **{ENV_FW: fw, ENV_REQUIRE: ",".join(required)},
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "upstream_tests",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(work),
        *files,
        *(["-k", " or ".join(keywords)] if keywords else []),
        *extra,
    ]
    logger.info("in %s: %s", work / "upstream", " ".join(cmd))
    try:
        return subprocess.run(cmd, cwd=work / "upstream", env=env).returncode
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
