"""`hf:` model sources through huggingface_hub: the user's cache, token and offline setting are the library's
own (HF_HOME / HF_HUB_CACHE, HF_TOKEN or `hf auth login`, HF_HUB_OFFLINE); nothing the cache holds is fetched
again, and long downloads show the library's progress bars.

    hf:ORG/REPO/FILE.gguf          one file (a split file's first part brings all its parts)
    hf:ORG/REPO:Q4_K_M             the quant of that name in a GGUF repo (split or not)
    hf:ORG/REPO@REV…               a revision pin (branch, tag or commit), before the file or the quant
    hf:ORG/REPO                    a repo with one GGUF, or a safetensors checkpoint (converted, see convert.py)

The resolved commit is returned with the files, so every row can say exactly which upload it measured."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import DevicelabError

SPEC = re.compile(
    r"^hf:(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?:@(?P<rev>[\w.-]+))?"
    r"(?:/(?P<file>[^:@]+\.gguf)|:(?P<quant>[A-Za-z0-9_]+))?$"
)
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")
CHECKPOINT_FILES = ["*.safetensors", "*.json", "tokenizer.model", "*.tiktoken", "*.txt", "*.py"]


@dataclass(frozen=True)
class HubRef:
    repo: str
    revision: str | None = None
    file: str | None = None
    quant: str | None = None

    def __str__(self) -> str:
        s = f"hf:{self.repo}" + (f"@{self.revision}" if self.revision else "")
        return s + (f"/{self.file}" if self.file else f":{self.quant}" if self.quant else "")


@dataclass(frozen=True)
class Resolved:
    ref: HubRef
    commit: str
    files: list[Path]  # a GGUF's parts in order (one for an unsplit file); empty for a checkpoint
    folder: Path  # the snapshot folder (a checkpoint's files are in it)

    @property
    def is_checkpoint(self) -> bool:
        return not self.files

    def provenance(self) -> dict:
        return {
            "spec": str(self.ref),
            "repo": self.ref.repo,
            "revision": self.ref.revision or "main",
            "commit": self.commit,
            "files": [f.name for f in self.files],
        }


def parse(spec: str) -> HubRef:
    m = SPEC.match(spec.strip())
    if not m:
        raise DevicelabError(
            f"{spec!r} is not an hf: source; write hf:ORG/REPO/FILE.gguf, hf:ORG/REPO:Q4_K_M, "
            "hf:ORG/REPO@REVISION… or hf:ORG/REPO (a checkpoint)"
        )
    return HubRef(m["repo"], m["rev"], m["file"], m["quant"])


def _parts(name: str, names: list[str]) -> list[str]:
    """A split file's parts, in order (the file alone when it is not split); a missing part is an error."""
    m = SPLIT.match(PurePosixPath(name).name)
    if not m:
        return [name]
    folder = str(PurePosixPath(name).parent)
    prefix = "" if folder == "." else folder + "/"
    want = [f"{prefix}{m['stem']}-{i:05d}-of-{m['n']}.gguf" for i in range(1, int(m["n"]) + 1)]
    missing = [w for w in want if w not in names]
    if missing:
        raise DevicelabError(f"{name} is part of a split GGUF whose part {missing[0]} is not in the repo/cache")
    return want


def choose(ref: HubRef, names: list[str]) -> list[str]:
    """The files a ref names among a repo's (or a cached snapshot's) file names: a GGUF's parts in order, or
    [] for a safetensors checkpoint. Pure."""
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if ref.file:
        if ref.file not in names:
            near = ", ".join(PurePosixPath(g).name for g in ggufs[:8]) or "no .gguf files"
            raise DevicelabError(f"{ref}: no file {ref.file} in {ref.repo} (it has {near})")
        return _parts(ref.file, names)
    if ref.quant:
        q = re.compile(rf"(?i)(^|[-_./]){re.escape(ref.quant)}([-_./]|$)")
        hits = [g for g in ggufs if q.search(g[: -len(".gguf")] + ".")]
        firsts = sorted({_parts(g, names)[0] for g in hits})
        if not firsts:
            have = sorted(
                {
                    m.group(0).strip("-_./").upper()
                    for g in ggufs
                    for m in [re.search(r"(?i)[-_.](I?Q\d\w*|F16|BF16|F32)(?=[-_.])", g[:-5] + ".")]
                    if m
                }
            )
            raise DevicelabError(
                f"{ref}: {ref.repo} has no {ref.quant} file"
                + (f"; it has {', '.join(have)}" if have else "; it has no .gguf files")
            )
        if len(firsts) > 1:
            raise DevicelabError(
                f"{ref}: {len(firsts)} files match {ref.quant} ({', '.join(firsts[:4])}); name one "
                f"with hf:{ref.repo}/FILE.gguf"
            )
        return _parts(firsts[0], names)
    if any(n.endswith(".safetensors") for n in names):
        return []
    firsts = sorted({_parts(g, names)[0] for g in ggufs})
    if len(firsts) == 1:
        return _parts(firsts[0], names)
    if not firsts:
        raise DevicelabError(f"{ref}: {ref.repo} holds neither a .gguf file nor a safetensors checkpoint")
    raise DevicelabError(
        f"{ref}: {ref.repo} holds {len(firsts)} GGUF files; pick one with hf:{ref.repo}:QUANT "
        f"(e.g. hf:{ref.repo}:Q4_K_M) or hf:{ref.repo}/FILE.gguf"
    )


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _fetch_hint(ref: HubRef) -> str:
    inc = f" --include '{ref.file}'" if ref.file else f" --include '*{ref.quant}*'" if ref.quant else ""
    rev = f" --revision {ref.revision}" if ref.revision else ""
    return f"`hf download {ref.repo}{rev}{inc}` where the hub can be reached, or unset HF_HUB_OFFLINE"


def _cached_listing(ref: HubRef, rev: str) -> tuple[str, list[str]]:
    """Offline: the commit a revision names in the cache (refs/REV), and the repo's file names at that commit —
    the whole repo's, from the tree listing the library cached when it last fetched, else the files the
    snapshot holds."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import read_tree_cache, repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=ref.repo, repo_type="model")
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        commit = rev
    elif (storage / "refs" / rev).is_file():
        commit = (storage / "refs" / rev).read_text().strip()
    else:
        raise DevicelabError(
            f"{ref}: revision {rev} of {ref.repo} is not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set; fetch it with {_fetch_hint(ref)}"
        )
    folder = storage / "snapshots" / commit
    tree = read_tree_cache(str(storage), commit)
    if tree:
        return commit, sorted(tree)
    if not folder.is_dir():
        raise DevicelabError(
            f"{ref}: commit {commit[:12]} of {ref.repo} is not in the Hugging Face cache; fetch it "
            f"with {_fetch_hint(ref)}"
        )
    return commit, sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def resolve(spec: str) -> Resolved:
    """Resolve an hf: source to files in the huggingface_hub cache, fetching what the cache lacks (online)."""
    import huggingface_hub as hh
    from huggingface_hub import errors

    ref = parse(spec)
    rev = ref.revision or "main"
    with answers(ref, rev):
        try:
            if offline():
                commit, names = _cached_listing(ref, rev)
                try:
                    chosen = choose(ref, names)
                except DevicelabError as e:
                    raise DevicelabError(
                        f"{e} (offline: only the cache was searched; fetch it with {_fetch_hint(ref)})"
                    ) from None
                # the library itself confirms the snapshot holds every chosen file
                folder = Path(
                    hh.snapshot_download(
                        ref.repo, revision=commit, local_files_only=True, allow_patterns=chosen or CHECKPOINT_FILES
                    )
                )
            else:
                info = hh.HfApi().model_info(ref.repo, revision=rev)
                if info.sha is None:  # the hub names it; its client's type allows none
                    raise DevicelabError(f"{ref}: the hub named no commit of {ref.repo} at {rev}")
                commit = info.sha
                chosen = choose(ref, [s.rfilename for s in info.siblings or []])
                folder = Path(
                    hh.snapshot_download(ref.repo, revision=commit, allow_patterns=chosen or CHECKPOINT_FILES)
                )
        except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, errors.IncompleteSnapshotError) as e:
            raise DevicelabError(
                f"{ref} is not in the Hugging Face cache ({type(e).__name__}); fetch it with {_fetch_hint(ref)}"
            ) from None
    return _in_cache(ref, folder, chosen, commit)


@contextmanager
def answers(ref: HubRef, rev: str):
    """The hub's refusals, and a hub that cannot be reached, as one line each."""
    from huggingface_hub import constants, errors

    try:
        yield
    except errors.GatedRepoError:
        raise DevicelabError(
            f"{ref.repo} is gated: accept its terms on the hub, then log in (`hf auth login`) or set HF_TOKEN"
        ) from None
    except errors.RepositoryNotFoundError:
        raise DevicelabError(
            f"{ref.repo}: no such repo on the hub (or it is private: log in with `hf auth login` or set HF_TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise DevicelabError(f"{ref}: {ref.repo} has no revision {rev}") from None
    except errors.HfHubHTTPError as e:
        raise DevicelabError(f"{ref}: the hub answered {str(e).splitlines()[0][:160]}") from None
    except Exception as e:  # the HTTP client's own errors (httpx or requests): the hub cannot be reached
        if type(e).__module__.split(".")[0] not in {"httpx", "httpx2", "requests", "urllib3"}:
            raise
        raise DevicelabError(
            f"{ref}: cannot reach the hub at {constants.ENDPOINT} ({type(e).__name__}); check the network, or set "
            "HF_HUB_OFFLINE=1 to work from what was fetched before"
        ) from None


def _in_cache(ref: HubRef, folder: Path, chosen: list[str], commit: str) -> Resolved:
    files = [folder / n for n in chosen]
    missing = [f for f in files if not f.exists()]
    if missing:
        raise DevicelabError(f"{ref}: {missing[0].name} is not in the cache; fetch it with {_fetch_hint(ref)}")
    return Resolved(ref, commit, files, folder)
