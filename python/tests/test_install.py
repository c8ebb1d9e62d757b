"""`pip install` of the package (python/pyproject.toml) as a user runs it, offline: a copy of the
sources is installed, plainly and editable, and is byte for byte as it was after (setuptools
wrote build/ and skyforge.egg-info into it); the wheel holds the package and declares what the
pool imports (joblib, cloudpickle, numpy); a missing joblib is named with what to pip install.
pip builds with this interpreter's flit_core (--no-build-isolation --no-index: no network), so
the install tests skip, saying so, where flit_core is not installed."""
import os
import shutil
import subprocess
import sys

import pytest

SOURCES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/


def tree(root):
    """Every path under root with its size and modification time."""
    out = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(here, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def sources(tmp_path):
    pytest.importorskip("flit_core", reason=f"{sys.executable} lacks flit_core, the package's build backend "
                                            "(pip install flit_core, or Debian's flit): the install is built offline")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(SOURCES, name), src)
    shutil.copytree(os.path.join(SOURCES, "skyforge"), src / "skyforge", ignore=shutil.ignore_patterns("__pycache__"))
    return src


def pip_install(*args):
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
           "--no-cache-dir", "--disable-pip-version-check", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""))
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout}{done.stderr}"


def imported_from(site):
    """Where `import skyforge` comes from with `site` first on the path (its .pth files read), ahead
    of this interpreter's own site-packages, which may hold skyforge too (CI's venv, editable)."""
    code = ("import site, sys; before = list(sys.path); site.addsitedir(" + repr(str(site)) + "); "
            "sys.path[:] = [p for p in sys.path if p not in before] + before; "
            "import skyforge; print(skyforge.__file__)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd="/", env=dict(os.environ, PYTHONPATH="")).stdout.strip()


def test_pip_install_leaves_the_sources_as_they_were_and_declares_the_pools_dependencies(sources, tmp_path):
    before = tree(sources)
    pip_install("--target", str(tmp_path / "site"), str(sources))
    assert tree(sources) == before
    with open(tmp_path / "site" / "skyforge-0.1.0.dist-info" / "METADATA") as f:
        requires = {line.split(":", 1)[1].strip().split(";")[0].strip() for line in f if line.startswith("Requires-Dist:")}
    assert {"joblib>=1.2", "cloudpickle", "numpy"} <= requires, requires
    assert imported_from(tmp_path / "site") == str(tmp_path / "site" / "skyforge" / "__init__.py")


def test_an_editable_install_leaves_the_sources_as_they_were_and_points_at_them(sources, tmp_path):
    before = tree(sources)
    pip_install("--target", str(tmp_path / "site"), "--editable", str(sources))
    assert tree(sources) == before
    assert imported_from(tmp_path / "site") == str(sources / "skyforge" / "__init__.py")


def test_a_missing_joblib_is_named_with_what_to_install():
    code = "import sys; sys.modules['joblib'] = None; import skyforge; skyforge.joblib_pool"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "skyforge.joblib_pool needs joblib" in done.stderr and "pip install 'joblib>=1.2'" in done.stderr, done.stderr
