"""Where a pool finds its plugins, on real local pools (the `skyforge` binary from $SKYFORGE_BIN):
a pool.toml's `[job] plugin_path` (relative to its directory, searched first, the rest of the
file's lines keeping their numbers in errors) and `$SKYFORGE_PLUGIN_PATH` in the caller's
environment. The plugin found is a copy of the `local` provider whose plugin.toml puts the
nodes' directories elsewhere (its `work_root` default): where a task runs says which was used."""
import glob
import os

import pytest

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed  # noqa: E402

import skyforge  # noqa: E402


@pytest.fixture
def pool_env(skyforge_bin, tmp_path, monkeypatch):
    monkeypatch.setenv("SKYFORGE_BIN", skyforge_bin)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("SKYFORGE_PLUGIN_PATH", raising=False)
    return tmp_path


@pytest.fixture
def plugins(skyforge_bin, tmp_path):
    """tmp_path/plugins/local: the built `local` provider, its nodes' directories in tmp_path/elsewhere."""
    found = glob.glob(os.path.join(os.path.dirname(skyforge_bin), "..", "lib*", "skyforge", "plugins", "local",
                                   "plugin.toml"))
    assert found, f"no local provider beside {skyforge_bin}"
    with open(found[0]) as f:
        text = f.read()
    library = os.path.join(os.path.dirname(os.path.abspath(found[0])), "liblocal.so")
    text = text.replace('library = "liblocal.so"', f'library = "{library}"', 1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    old = '[options.work_root]\ntype = "string"\ndefault = ""'
    assert old in text, "the local provider's work_root option changed: update this test"
    text = text.replace(old, f'[options.work_root]\ntype = "string"\ndefault = "{elsewhere}"', 1)
    (tmp_path / "plugins" / "local").mkdir(parents=True)
    (tmp_path / "plugins" / "local" / "plugin.toml").write_text(text)
    return elsewhere


def where_it_runs(_):
    return os.getcwd()


def ran_in(elsewhere):
    # Two slots, so that n_jobs=-1 runs on the pool, not in the caller.
    dirs = Parallel(n_jobs=-1, batch_size=1)(delayed(where_it_runs)(i) for i in range(2))
    return all(d.startswith(str(elsewhere) + os.sep) for d in dirs)


def test_a_pool_toml_sets_plugin_path_relative_to_its_directory(pool_env, plugins, monkeypatch):
    manifest = pool_env / "pool.toml"
    manifest.write_text('[pool]\nprovider = "local"\nnodes = 1\nconcurrency = 2\n\n[job]\nplugin_path = [\n  "plugins",  # ours\n]\n\n'
                        '[provider]\nkeep_workdirs = false\n')
    monkeypatch.chdir("/")  # relative to the file, not to where the caller runs
    with skyforge.joblib_pool(str(manifest)):
        assert ran_in(plugins)
    assert os.listdir(plugins) == [] and not glob.glob(str(pool_env / ".skyforge-pool-*"))


def test_skyforge_plugin_path_in_the_callers_environment_is_searched(pool_env, plugins, monkeypatch):
    monkeypatch.setenv("SKYFORGE_PLUGIN_PATH", str(pool_env / "plugins"))
    with skyforge.joblib_pool(nodes=1, concurrency=2):
        assert ran_in(plugins)


def start(manifest):
    with skyforge.joblib_pool(str(manifest)):
        pass


def test_plugin_path_mistakes_name_the_file(pool_env):
    manifest = pool_env / "pool.toml"
    # The [job] table's lines are left out of the job's manifest blank: the others keep their numbers.
    manifest.write_text('[job]\nplugin_path = ["plugins"]\n[pool]\nnodes = "two"\n')
    with pytest.raises(skyforge.PoolError, match=r"pool\.toml:4:9: \[pool\] nodes"):
        start(manifest)
    manifest.write_text('[pool]\nprovider = "nosuch"\nnodes = 1\n[job]\nplugin_path = ["plugins"]\n')
    with pytest.raises(skyforge.PoolError, match=r"pool\.toml:2:12: .*no plugin named 'nosuch' \(searched: "
                                                 + str(pool_env / "plugins")):
        start(manifest)
    manifest.write_text('[pool]\nnodes = 1\n[job]\nplugin_path = "plugins"\n')
    with pytest.raises(skyforge.PoolError, match=r"pool\.toml: \[job\] plugin_path: expected an array of strings"):
        start(manifest)
    manifest.write_text('job.plugin_path = ["plugins"]\n[pool]\nnodes = 1\n')
    with pytest.raises(skyforge.PoolError, match=r"pool\.toml: write plugin_path in a \[job\] table of its own"):
        start(manifest)
    assert not glob.glob(str(pool_env / ".skyforge-pool-*")) and not glob.glob(str(pool_env / "skyforge-*"))
