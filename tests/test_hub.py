"""hf: sources resolved against a Hugging Face cache laid out exactly as huggingface_hub lays it out (blobs named
by their sha256, snapshots/<commit>/ links into them, refs/<revision>, the cached tree listing), made with the
library's own functions, with HF_HUB_OFFLINE=1. The hub is the one peer that cannot run here: these machines
reach no hub, so the cache stands in for what a download would have left. The GGUFs in it are real (SmolLM2
from PyPI, split with the pinned llama-gguf-split)."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import devicelab

from devicelab.errors import DevicelabError
from devicelab.models import gguf_info, hub

REPO_ID = "devicelab-test/SmolLM2-135M-GGUF"
C1, C2 = "1" * 40, "2" * 40


def _put(storage: Path, commit: str, name: str, src: Path) -> None:
    """A file as hf_hub_download leaves it: its blob (named by sha256) and the snapshot's relative link."""
    from huggingface_hub.file_download import _create_symlink

    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    blob = storage / "blobs" / sha
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        shutil.copyfile(src, blob)
    dst = storage / "snapshots" / commit / name
    dst.parent.mkdir(parents=True, exist_ok=True)
    _create_symlink(str(blob), str(dst), new_blob=False)


@pytest.fixture(scope="module")
def cache(tmp_path_factory, smol_path, host_build):
    from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision, repo_folder_name

    root = tmp_path_factory.mktemp("hf") / "hub"
    storage = root / repo_folder_name(repo_id=REPO_ID, repo_type="model")
    parts = tmp_path_factory.mktemp("split")
    import subprocess

    subprocess.run(
        [
            host_build.tool("llama-gguf-split"),
            "--split",
            "--split-max-tensors",
            "100",
            smol_path,
            parts / "SmolLM2-135M-Q4_1",
        ],
        check=True,
        capture_output=True,
    )
    split = sorted(parts.glob("*.gguf"))
    assert len(split) >= 2, split
    # revision 1 (tag v1): one file. revision 2 (main): the same file renamed, and the split one
    _put(storage, C1, "SmolLM2-135M-Q4_1.gguf", smol_path)
    _put(storage, C2, "smollm2-135m-q4_1.gguf", smol_path)
    for p in split:
        _put(storage, C2, f"split/{p.name.replace('SmolLM2-135M-Q4_1', 'smollm2-135m-Q8_0')}", p)
    _cache_commit_hash_for_specific_revision(str(storage), "v1", C1)
    _cache_commit_hash_for_specific_revision(str(storage), "main", C2)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "v1").write_text(C1)
    (storage / "refs" / "main").write_text(C2)
    return root, split


@pytest.fixture
def offline(cache, monkeypatch):
    from huggingface_hub import constants

    root, _ = cache
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return root


def test_parse_and_choose():
    r = hub.parse("hf:org/repo@v2:Q4_K_M")
    assert (r.repo, r.revision, r.quant, r.file) == ("org/repo", "v2", "Q4_K_M", None)
    r = hub.parse("hf:org/repo/sub/m-Q8_0-00001-of-00002.gguf")
    assert (r.repo, r.file) == ("org/repo", "sub/m-Q8_0-00001-of-00002.gguf")
    names = ["m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "Q8_0/m-Q8_0-00001-of-00002.gguf", "Q8_0/m-Q8_0-00002-of-00002.gguf"]
    assert hub.choose(hub.parse("hf:o/r:q4_k_m"), names) == ["m-Q4_K_M.gguf"]
    assert hub.choose(hub.parse("hf:o/r:Q8_0"), names) == names[2:]
    with pytest.raises(DevicelabError, match="has no IQ2_XS file; it has Q4_K_M, Q4_K_S, Q8_0"):
        hub.choose(hub.parse("hf:o/r:IQ2_XS"), names)
    with pytest.raises(DevicelabError, match="part Q8_0/m-Q8_0-00002-of-00002.gguf is not in"):
        hub.choose(hub.parse("hf:o/r:Q8_0"), names[:3])
    with pytest.raises(DevicelabError, match="holds 3 GGUF files; pick one with hf:o/r:QUANT"):
        hub.choose(hub.parse("hf:o/r"), names)
    assert hub.choose(hub.parse("hf:o/r"), ["model.safetensors", "config.json"]) == []
    with pytest.raises(DevicelabError, match="not an hf: source"):
        hub.parse("hf:just-a-name")


def test_resolve_from_the_cache_offline(offline, cache, smol_path):
    _, split = cache
    r = hub.resolve(f"hf:{REPO_ID}:Q4_1")
    assert r.commit == C2 and [f.name for f in r.files] == ["smollm2-135m-q4_1.gguf"]
    assert r.files[0].read_bytes()[:4] == b"GGUF" and "/snapshots/" + C2 in str(r.files[0])
    # a revision pin: the tag's commit, the file under its name then
    r = hub.resolve(f"hf:{REPO_ID}@v1/SmolLM2-135M-Q4_1.gguf")
    assert r.commit == C1 and r.provenance()["revision"] == "v1"
    # a split quant: every part, first part first; its size and parameters are the whole model's
    r = hub.resolve(f"hf:{REPO_ID}:Q8_0")
    assert [f.name for f in r.files] == [p.name.replace("SmolLM2-135M-Q4_1", "smollm2-135m-Q8_0") for p in split]
    whole, parts = gguf_info.read(smol_path), gguf_info.read(r.files[0])
    assert parts.n_params == whole.n_params and parts.tensor_types == whole.tensor_types
    assert gguf_info.content_sha256(r.files[0]) != gguf_info.content_sha256(r.files[1])


def test_missing_offline_is_one_line_saying_what_to_fetch(offline):
    with pytest.raises(DevicelabError) as e:
        hub.resolve(f"hf:{REPO_ID}:Q4_K_M")
    msg = str(e.value)
    assert "\n" not in msg and "has no Q4_K_M file; it has" in msg
    assert f"hf download {REPO_ID} --include '*Q4_K_M*'" in msg
    with pytest.raises(DevicelabError, match="revision v9 of .* is not in the Hugging Face cache"):
        hub.resolve(f"hf:{REPO_ID}@v9:Q4_1")
    with pytest.raises(DevicelabError, match="not in the Hugging Face cache"):
        hub.resolve("hf:nobody/nothing:Q4_0")


def test_model_info_and_ladder_take_hf_sources(cache, tmp_path):
    root, _ = cache
    env = {"HF_HUB_CACHE": str(root), "HF_HUB_OFFLINE": "1"}
    p = devicelab("model", "info", f"hf:{REPO_ID}:Q8_0", "--json", env=env)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["arch"] == "llama" and info["n_params"] > 100e6
    p = devicelab("model", "info", f"hf:{REPO_ID}:Q5_K_M", env=env)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.strip()]) == 1 and "hf download" in p.stderr


def test_a_published_quant_is_measured_as_published(offline, host_build):
    """hf:REPO:Q4_1 with q4_1 in the ladder: that very file (its sha256), not a requantization of a base."""
    from devicelab.hashing import sha256_file
    from devicelab.models.ladder import Ladder

    r = hub.resolve(f"hf:{REPO_ID}:Q4_1")
    lad = Ladder("hub-smollm2", r.files[0], host_build.tool("llama-quantize"))
    q = lad.quant("q4_1")
    assert q.sha256 == sha256_file(r.files[0]) and q.manifest["as_published"]
    q8 = lad.quant("q8_0")  # another quant is made from the base, as before
    assert "as_published" not in q8.manifest and q8.manifest["base_sha256"] == lad.base().sha256
