"""A real Python command app on a real local pool: instance_info() says what the C++ SDK says, and
shard() / DistributedSampler give every node what the C++ implementation gives it."""
import json
import os
import subprocess
import sys
import textwrap


SCRIPT = textwrap.dedent(
    """
    import json, os, numpy as np, skyforge
    info = skyforge.instance_info()
    with open(os.path.join(info.output_dir, "info.json"), "w") as f:
        json.dump(info.__dict__, f)
    x = np.arange(1000)
    mine = skyforge.shard(x, shuffle=True, seed=42)
    sampler = skyforge.DistributedSampler(1000, shuffle=True, seed=3)
    sampler.set_epoch(2)
    print("RESULT " + json.dumps({"info": info.__dict__, "shard": mine.tolist(), "sampler": list(sampler)}))
    """
)


def test_every_node_gets_the_sdks_answer(tmp_path, skyforge_bin, oracle):
    script = tmp_path / "node.py"
    script.write_text(SCRIPT)
    manifest = tmp_path / "job.toml"
    manifest.write_text(
        "[pool]\nnodes = 3\nconcurrency = 2\n"
        f"[job]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(script))}]\n"
    )
    env = dict(os.environ, TMPDIR=str(tmp_path))
    # The nodes import the package as this interpreter does (an install, or PYTHONPATH).
    pass_env = []
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
        pass_env = ["--env", "PYTHONPATH"]
    run = subprocess.run([skyforge_bin, "run", "--outputs", str(tmp_path / "out"), *pass_env, str(manifest)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    results = {}
    for line in run.stdout.splitlines():
        if "] RESULT " in line:
            node = int(line.split("]")[0].split()[-1])
            results[node] = json.loads(line.split("] RESULT ", 1)[1])
    assert sorted(results) == [0, 1, 2], run.stdout
    pool_ids = {r["info"]["pool_id"] for r in results.values()}
    assert len(pool_ids) == 1 and pool_ids != {""}
    for node, r in results.items():
        info = r["info"]
        assert (info["node"], info["total_nodes"], info["is_head"]) == (node, 3, node == 0)
        assert info["concurrency"] == 2
        assert info["local_rank"] == node and info["local_world_size"] == 3  # one machine
        assert info["head_addr"] and info["private_ip"]
        assert os.path.basename(info["work_dir"]) and info["accelerators"] == 0
        # What the node wrote into its output directory came back here.
        assert info["output_dir"] == info["work_dir"] + "/.skyforge/outputs"
        assert json.loads((tmp_path / "out" / f"node-{node}" / "info.json").read_text()) == info
        assert r["shard"] == oracle("shard", 1000, node, 3, 1, 42)
        assert r["sampler"] == oracle("sampler", 1000, node, 3, 1, 3, 0, 2)
