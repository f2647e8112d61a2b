"""The scripts support Python 3.10, the oldest that the requirements install on (nvidia-dali-cuda120 2.4.0 asks for
>= 3.10): every root .py parses as 3.10 and calls nothing of the standard library that is newer; where a python3.10
runs, every root .py compiles under it and data_processing.py's hashing gives the digest it gives here."""

import ast
import glob
import hashlib
import os
import shutil
import subprocess

import numpy as np
import pytest

from data_processing import _sha256

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = sorted(glob.glob(os.path.join(HERE, "*.py")))
OLDEST = (3, 10)
# Standard-library names added after 3.10 that scripts like these reach for; hashlib.file_digest was one.
NEWER = {
    "hashlib.file_digest",
    "tomllib",
    "datetime.UTC",
    "typing.Self",
    "typing.LiteralString",
    "typing.Never",
    "typing.assert_never",
    "typing.reveal_type",
    "typing.override",
    "itertools.batched",
    "asyncio.TaskGroup",
    "asyncio.timeout",
    "enum.StrEnum",
    "contextlib.chdir",
    "math.cbrt",
    "math.exp2",
    "math.sumprod",
    "os.process_cpu_count",
    "ExceptionGroup",
    "BaseExceptionGroup",
}


def names(tree):
    """The names ``tree`` uses: ``a``, ``module.attr`` and what it imports, as ``module.name``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            yield f"{node.value.id}.{node.attr}"
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def newer_than_oldest(source, path="<string>"):
    """The NEWER names that ``source`` uses; a SyntaxError if it is not 3.10 syntax (but for 3.12's f-strings, which
    a 3.12+ parser lets through: the python3.10 tests below catch those)."""
    return sorted(NEWER.intersection(names(ast.parse(source, path, feature_version=OLDEST))))


def test_the_check_finds_newer_syntax_and_calls():
    with pytest.raises(SyntaxError):
        newer_than_oldest(
            "try:\n    pass\nexcept* OSError:\n    pass\n"
        )  # exception groups are 3.11
    with pytest.raises(SyntaxError):
        newer_than_oldest("def first[T](items: list[T]) -> T: ...\n")  # type parameters are 3.12
    assert newer_than_oldest(
        "import hashlib\nhashlib.file_digest(f, 'sha256')\nfrom typing import Self\n"
    ) == ["hashlib.file_digest", "typing.Self"]


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_every_script_is_python_3_10(path):
    with open(path) as f:
        assert newer_than_oldest(f.read(), path) == []


def test_sha256_is_hashlibs_over_several_chunks(tmp_path):
    data = np.random.default_rng(0).bytes(5 << 19)  # 2.5 MiB: two whole chunks of 1 MiB and a part
    (tmp_path / "data").write_bytes(data)
    with open(tmp_path / "data", "rb") as f:
        assert _sha256(f) == hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def python310():
    """A python3.10 on PATH that runs; a pyenv shim of a version that pyenv has not selected does not."""
    exe = shutil.which("python3.10")
    if (
        exe is None
        or subprocess.run(
            [exe, "-c", "import sys; assert sys.version_info[:2] == (3, 10)"], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip(
            "no python3.10 on PATH that runs (pyenv: PYENV_VERSION=$(pyenv version-name):3.10.13)"
        )
    return exe


# Compiles without writing .pyc files; -W error makes a SyntaxWarning (an invalid escape, say) fail too.
COMPILE = """
import sys
for path in sys.argv[1:]:
    with open(path) as f:
        compile(f.read(), path, "exec")
"""


def test_every_script_compiles_under_python310(python310):
    result = subprocess.run(
        [python310, "-W", "error", "-c", COMPILE, *SCRIPTS], capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (0, "")


def test_sha256_under_python310_gives_the_same_digest(python310, tmp_path):
    with open(os.path.join(HERE, "data_processing.py")) as f:
        source = f.read()
    function = next(
        node for node in ast.parse(source).body if getattr(node, "name", None) == "_sha256"
    )
    # The function alone, with the one module it needs: python3.10 here has no numpy, torch or DALI.
    code = (
        f"import hashlib, sys\n{ast.get_source_segment(source, function)}\n"
        f"with open(sys.argv[1], 'rb') as f:\n    print(_sha256(f))\n"
    )
    path = tmp_path / "data"
    path.write_bytes(np.random.default_rng(1).bytes(5 << 19))
    result = subprocess.run([python310, "-c", code, str(path)], capture_output=True, text=True)
    with open(path, "rb") as f:
        assert (result.returncode, result.stdout, result.stderr) == (0, _sha256(f) + "\n", "")
