"""deepx formats through the daemon: u64 feature ids, labels, weights and uuid strings delivered in
the slot layout, read as NumPy views, equal to `minibatchd dump`."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import minibatchd
from conftest import BIN, Daemon

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures_deepx"


class DeepxDaemon(Daemon):
    """A daemon serving one deepx fixture as dataset `train`."""

    def __init__(self, tmp: Path, fixture: str):
        shutil.copy(FIXTURES / fixture / "data.txt", tmp / "data.txt")
        body = (FIXTURES / fixture / "config.toml").read_text()
        body = body.split("[datasets.d]", 1)[1].replace('files = ["data.txt"]', f'files = ["{tmp}/data.txt"]')
        self.tmp = tmp
        self.socket = str(tmp / "mbd.sock")
        self.config = tmp / "minibatchd.toml"
        self.config.write_text(
            f'[daemon]\nsocket = "{self.socket}"\nmetrics_listen = "127.0.0.1:0"\nstate_dir = "{tmp}/state"\n'
            f"memory_limit_bytes = 268435456\nring_slots = 4\nslot_size_bytes = 65536\nshutdown_grace_secs = 1\n\n[datasets.train]{body}"
        )
        self._start()


@pytest.fixture(params=["libsvm_tensors_w_and_uuid", "uch_history_slots", "libsvm_ex_groups"])
def deepx_daemon(request, tmp_path):
    d = DeepxDaemon(tmp_path, request.param)
    yield d
    d.stop()


def test_deepx_sessions_equal_dump(deepx_daemon):
    for options, args in [
        (dict(minibatch_size=2, full_sweep=True, randomize=False), ["--minibatch-size", "2", "--full-sweep", "--randomize", "false"]),
        (dict(minibatch_size=3, max_sweeps=2, seed=4), ["--minibatch-size", "3", "--max-sweeps", "2", "--seed", "4"]),
    ]:
        source = minibatchd.connect(deepx_daemon.socket).open("train", **options)
        got = [mb.to_dump() for mb in source]
        assert got == deepx_daemon.dump(*args)
        assert got


def test_feature_ids_are_uint64_views_and_uuids_strings(tmp_path):
    d = DeepxDaemon(tmp_path, "libsvm_tensors_w_and_uuid")
    try:
        source = minibatchd.connect(d.socket).open("train", minibatch_size=100, full_sweep=True, randomize=False)
        mb = next(source)
        x = mb["__instX"]
        assert x.kind == "sparse" and x.indices.dtype == np.uint64
        values, indices, indptr = x.csr_arrays()
        assert len(indptr) == x.num_samples + 1 and indptr[-1] == len(indices) == len(values)
        uuid = mb["__instUUID"]
        assert uuid.kind == "strings" and "abcde" in uuid.strings()
        assert mb["__instY"].values.shape[0] == x.num_samples
        try:
            import scipy  # noqa: F401
        except ImportError:
            with pytest.raises(ImportError):
                x.csr()
        else:
            if int(indices.max()) >= 2**63 - 1:
                # This fixture has an id of 2^64 - 1: scipy cannot index it, and says so.
                with pytest.raises(ValueError, match="does not fit"):
                    x.csr()
            else:
                m = x.csr()
                assert m.shape[0] == x.num_samples and m.nnz <= len(indices)
    finally:
        d.stop()
