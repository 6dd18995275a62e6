"""Session fixture: a real API server from deploy/testcluster, with the watcher's ServiceAccount.

* Binaries missing (deploy/testcluster/build.sh not run): the k8s tests skip, with the command
  to run, unless QM_REQUIRE_K8S=1 (CI), where they fail.
* The tests' cluster gets its own temporary run dir and free loopback ports (unless
  QM_TESTCLUSTER_RUN / _PORT / _ETCD_PORT are set), so it never clobbers a developer's cluster
  or a parallel test run; it starts fresh and is stopped and removed at the end
  (QM_KEEP_TESTCLUSTER=1 keeps it running for a look with kubectl: the run dir is printed).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
from k8s_harness import FIXTURES, KINDS, TESTCLUSTER, VOLCANO_CRD, ClusterInfo, apply, load_yaml

from services.demo.stack import free_base_port
from services.watcher.kube import Credentials, Kube, KubeError, api_client, resource_path

BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "kwok")


def testcluster_env() -> dict[str, str]:
    """Its own run dir and free ports unless told otherwise, so parallel test runs on one
    machine (and a developer's own cluster on the default ports) never collide."""
    env = dict(os.environ)
    if "QM_TESTCLUSTER_RUN" not in env:
        env["QM_TESTCLUSTER_RUN"] = tempfile.mkdtemp(prefix="qm-testcluster-pytest-")
        env["QM_TESTCLUSTER_TEMP_RUN"] = "1"
    base = free_base_port(3)  # three free ports in a row, below the ephemeral range
    env.setdefault("QM_TESTCLUSTER_PORT", str(base))
    env.setdefault("QM_TESTCLUSTER_ETCD_PORT", str(base + 1))
    env.setdefault("QM_TESTCLUSTER_ETCD_PEER_PORT", str(base + 2))
    return env


async def _bootstrap(server: str, ca: str, admin_token: str) -> str:
    """Nodes, Kueue CRDs + the field report's queue config, ml-team, the watcher's RBAC; returns
    a token for the qm-watcher ServiceAccount (TokenRequest API)."""
    kube = Kube(api_client(Credentials(server, admin_token, ca)))
    try:
        for path in (TESTCLUSTER / "nodes.yaml", TESTCLUSTER / "kueue-crds.yaml",
                     FIXTURES / "ml-team.yaml",
                     TESTCLUSTER.parent / "kubernetes" / "watcher-rbac.yaml"):
            for obj in load_yaml(path):
                await apply(kube, obj)
        # CRDs become servable a moment after creation.
        for _ in range(100):
            try:
                await kube.get("/apis/kueue.x-k8s.io/v1beta1/resourceflavors")
                break
            except KubeError:
                await asyncio.sleep(0.1)
        for obj in load_yaml(FIXTURES / "queue-config.yaml"):
            assert obj["kind"] in KINDS
            await apply(kube, obj)
        # The ServiceAccount's token: TokenRequest, as a pod's projected token would be.
        for _ in range(50):
            try:
                tr = await kube.request(
                    "POST",
                    resource_path("", "v1", "serviceaccounts", "quartermaster", "qm-watcher", "token"),
                    body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": {"expirationSeconds": 7200}})
                return tr["status"]["token"]
            except KubeError as e:
                if e.status != 404:
                    raise
                await asyncio.sleep(0.1)
        raise RuntimeError("could not get a token for quartermaster/qm-watcher")
    finally:
        await kube.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterInfo]:
    bin_dir = subprocess.run(["bash", str(TESTCLUSTER / "build.sh"), "--print-bin"],
                             capture_output=True, text=True, check=True).stdout.strip()
    missing = [b for b in BINARIES if not os.access(os.path.join(bin_dir, b), os.X_OK)]
    if missing:
        msg = (f"test cluster binaries missing in {bin_dir} ({', '.join(missing)}): "
               f"run deploy/testcluster/build.sh (first build: about 5 minutes)")
        if os.environ.get("QM_REQUIRE_K8S") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    env = testcluster_env()
    print(f"test cluster run dir: {env['QM_TESTCLUSTER_RUN']}")
    run = env["QM_TESTCLUSTER_RUN"]
    try:
        r = subprocess.run(["bash", str(TESTCLUSTER / "start.sh"), "--fresh"], env=env,
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.fail(f"start.sh failed:\n{r.stdout}\n{r.stderr}")
        vals = {}
        with open(os.path.join(run, "env")) as f:
            for line in f:
                k, _, v = line.removeprefix("export ").strip().partition("=")
                vals[k] = v
        token = asyncio.run(_bootstrap(vals["QM_K8S_SERVER"], vals["QM_K8S_CA"], vals["QM_K8S_ADMIN_TOKEN"]))
        yield ClusterInfo(server=vals["QM_K8S_SERVER"], ca_file=vals["QM_K8S_CA"],
                          admin_token=vals["QM_K8S_ADMIN_TOKEN"], watcher_token=token, run_dir=run,
                          env={k: v for k, v in env.items() if k.startswith("QM_TESTCLUSTER_")})
    finally:
        if env.get("QM_KEEP_TESTCLUSTER") != "1":
            subprocess.run(["bash", str(TESTCLUSTER / "stop.sh")], env=env, capture_output=True, timeout=60)
            if env.get("QM_TESTCLUSTER_TEMP_RUN") == "1":
                shutil.rmtree(run, ignore_errors=True)


@pytest.fixture
async def admin(cluster: ClusterInfo):
    kube = cluster.admin()
    yield kube
    await kube.close()


@pytest.fixture
async def watcher_kube(cluster: ClusterInfo):
    kube = cluster.watcher()
    yield kube
    await kube.close()


@pytest.fixture(scope="session")
def volcano_jobs(cluster: ClusterInfo) -> str:
    """Volcano's Job CRD, installed once (its controller is played by the tests); the path of
    ml-team's Volcano Jobs. Never deleted: a CRD being deleted is still served for a while, so a
    test installing it again right after raced that deletion, which then took its Jobs. Each test
    deletes the Volcano Jobs it made, so no other test's watcher reports them."""

    async def install() -> None:
        kube = cluster.admin()
        try:
            await apply(kube, VOLCANO_CRD)
            for _ in range(300):  # served, and its storage ready (a new CRD's answers 429 until then)
                if await kube.serves("batch.volcano.sh", "v1alpha1", "jobs"):
                    try:
                        await kube.get(resource_path("batch.volcano.sh", "v1alpha1", "jobs", "ml-team"))
                        return
                    except KubeError as e:
                        if not e.temporary and e.status != 404:
                            raise
                await asyncio.sleep(0.1)
            raise RuntimeError("Volcano's Job CRD was not served within 30 s")
        finally:
            await kube.close()

    asyncio.run(install())
    return resource_path("batch.volcano.sh", "v1alpha1", "jobs", "ml-team")
