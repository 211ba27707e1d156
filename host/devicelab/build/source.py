"""The pinned llama.cpp source: the tree vendored in a llama-cpp-python sdist (default) or a local
checkout / extracted tree / sdist file. Everything downstream is keyed by the commit read from it."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import paths
from ..errors import DevicelabError

DEFAULT_SOURCE = "pypi:llama-cpp-python==0.3.36"

# top-level folders of a llama.cpp tree that no build reads (not packed for device builds, not in its digest)
BUILD_EXCLUDE = {
    ".git",
    "build",
    "models",
    "media",
    "docs",
    "examples",
    "tests",
    "ci",
    "scripts",
    "gguf-py",
    "pocs",
    "licenses",
    "requirements",
}


@dataclass(frozen=True)
class SourceTree:
    """A llama.cpp source tree at a commit: what every build is made from."""

    path: Path  # the llama.cpp tree (has CMakeLists.txt and ggml/)
    commit: str  # full hash
    origin: str  # what the user asked for
    dirty: bool = False

    @property
    def short(self) -> str:
        return self.commit[:7]

    def to_json(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def tree_digest(path: Path) -> str:
    """What a build of this tree is made of: the sha256 of every file a build reads (not BUILD_EXCLUDE), by relative
    path — two trees at one commit with an edited file differ. Computed once per tree and state of its files."""
    files = []
    for p in sorted(Path(path).iterdir()):
        if p.name in BUILD_EXCLUDE or p.name.startswith(".devicelab"):
            continue
        files += [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    stat = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _digest(str(path), stat)


@functools.lru_cache(maxsize=8)
def _digest(root: str, stat: tuple) -> str:
    h = hashlib.sha256()
    for name, _, _ in stat:
        h.update(os.path.relpath(name, root).encode() + b"\0" + Path(name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _is_llama_tree(p: Path) -> bool:
    # tools/ since mid-2025; examples/ before (older releases' trees, for sweeps and bisects across them)
    return (
        (p / "CMakeLists.txt").exists()
        and (p / "ggml").is_dir()
        and ((p / "tools").is_dir() or (p / "examples").is_dir())
    )


def _git_commit(tree: Path) -> tuple[str, bool] | None:
    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        head = None
    if head is not None and head.returncode == 0 and len(head.stdout.strip()) >= 7:
        # a shallow sdist tree reports 'dirty' from stat noise; only a checkout's content changes count
        diff = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return head.stdout.strip(), bool(diff.stdout.strip())
    # a `.git` file pointing at a gitdir we can read without git
    gitfile = tree / ".git"
    if gitfile.is_file():
        txt = gitfile.read_text().strip()
        if txt.startswith("gitdir:"):
            head_file = (tree / txt.split(":", 1)[1].strip()) / "HEAD"
            if head_file.exists():
                h = head_file.read_text().strip()
                if len(h) == 40:
                    return h, False
    return None


def _locate_tree(p: Path) -> Path:
    for cand in (p, p / "vendor" / "llama.cpp"):
        if _is_llama_tree(cand):
            return cand
    raise DevicelabError(
        f"{p} is not a llama.cpp tree (no CMakeLists.txt + ggml/ + tools/, nor vendor/llama.cpp); "
        "give a llama.cpp checkout, an extracted llama-cpp-python sdist, or 'pypi:llama-cpp-python==VERSION'"
    )


def _extract_sdist(archive: Path) -> Path:
    name = archive.name.removesuffix(".tar.gz")
    dest = paths.sub("sources") / name
    marker = dest / ".devicelab-extracted"
    if not marker.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tf:
            tf.extractall(dest.parent, filter="tar")
        if not dest.exists():
            raise DevicelabError(f"{archive} did not unpack into {name}/; is it a llama-cpp-python sdist?")
        marker.write_text(str(archive))
    return dest


def _pip_download(requirement: str) -> Path:
    dl = paths.sub("downloads")
    pkg = requirement.split("==")[0].replace("-", "_")
    if "==" in requirement:
        hit = dl / f"{pkg}-{requirement.split('==')[1]}.tar.gz"
        if hit.exists():
            return hit
    r = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", requirement, "-d", str(dl)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise DevicelabError(
            f"could not download {requirement} from the package registry ({last}); "
            "check the version, or give a local llama.cpp checkout with --source PATH"
        )
    hits = sorted(dl.glob(f"{pkg}-*.tar.gz"), key=lambda p: p.stat().st_mtime)
    if not hits:
        raise DevicelabError(f"pip downloaded no sdist for {requirement} into {dl}")
    return hits[-1]


GIT_PREFIX = "git:"


def _git(repo: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout)


def _git_parts(spec: str) -> tuple[Path, str]:
    """'git:PATH@REV' -> (the repository's path, REV as given)."""
    path, at, rev = spec[len(GIT_PREFIX) :].rpartition("@")
    if not at or not path or not rev:
        raise DevicelabError(f"llama.cpp source {spec}: give git:PATH@REV (a llama.cpp clone and a revision)")
    return Path(path).expanduser().resolve(), rev


def _git_spec(spec: str) -> tuple[Path, str]:
    """'git:PATH@REV' -> (the repository, the full commit REV names)."""
    repo, rev = _git_parts(spec)
    r = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if r.returncode != 0 or not r.stdout.strip():
        raise DevicelabError(
            f"llama.cpp source {spec}: {repo} has no revision {rev!r} (is it a git clone of llama.cpp?)"
        )
    return repo, r.stdout.strip()


def _worktree(repo: Path) -> Path:
    return paths.sub("sources") / f"git-{hashlib.sha256(str(repo).encode()).hexdigest()[:12]}"


def _worktree_of(wt: Path, repo: Path) -> bool:
    """Whether `wt` is a worktree of this very repository (its git folder is the repository's)."""
    common = [_git(d, "rev-parse", "--path-format=absolute", "--git-common-dir") for d in (wt, repo)]
    return all(r.returncode == 0 for r in common) and common[0].stdout.strip() == common[1].stdout.strip()


def _git_checkout(repo: Path, commit: str) -> Path:
    """The repository at `commit`, in one worktree per repository under DEVICELAB_HOME/sources, checked out in
    place: every revision's build then sees the same source paths, so ccache reuses what did not change. The
    worktree holds one revision at a time: a build compiles it inside `checked_out`."""
    with paths.result_lock(_worktree(repo)):
        return _checkout_held(repo, commit)


def _checkout_held(repo: Path, commit: str) -> Path:
    wt = _worktree(repo)  # a checkout rewrites only the files that differ: an unchanged file keeps its time
    if (wt / ".git").exists() and not _worktree_of(wt, repo):
        shutil.rmtree(wt)  # the worktree of an earlier clone at this path (deleted and cloned again): made anew
    if not (wt / ".git").exists():
        _git(repo, "worktree", "prune")
        r = _git(repo, "worktree", "add", "--detach", "--force", str(wt), commit)
    else:
        r = _git(wt, "checkout", "--detach", "--force", "--quiet", commit)
    if r.returncode != 0:
        raise DevicelabError(f"could not check out {commit[:12]} of {repo}: {(r.stderr.strip() or 'git failed')[:300]}")
    return wt


@contextlib.contextmanager
def checked_out(src: SourceTree):
    """Held while a build compiles `src`: a revision of a clone (git:PATH@REV) shares one worktree with the clone's
    other revisions, so it is checked out again at its commit and no other revision is checked out until the build
    is done (a sweep or a bisect step resolves two revisions before building either). Other trees: as they are."""
    if not src.origin.startswith(GIT_PREFIX):
        yield
        return
    repo, _ = _git_parts(src.origin)
    with paths.result_lock(_worktree(repo)):
        _checkout_held(repo, src.commit)
        yield


def commit_of(spec: str | None) -> str:
    """The commit a source spec names, without changing any tree (a git revision is not checked out)."""
    if spec and spec.startswith(GIT_PREFIX):
        return _git_spec(spec)[1]
    return resolve(spec).commit


def resolve(spec: str | None = None) -> SourceTree:
    """Turn a source spec into a SourceTree with its commit. Specs: 'pypi:llama-cpp-python==X.Y.Z',
    a path to a llama.cpp checkout / extracted sdist, a path to a sdist .tar.gz, or 'git:PATH@REV' (a revision
    of a clone, checked out into devicelab's worktree of it)."""
    spec = spec or DEFAULT_SOURCE
    if spec.startswith("pypi:"):
        # one process downloads and unpacks a release at a time: another (a second run, the suite's background
        # builds) waits, then finds the archive whole and the tree unpacked
        with paths.result_lock(paths.sub("sources") / spec[len("pypi:") :]):
            root = _extract_sdist(_pip_download(spec[len("pypi:") :]))
    elif spec.startswith(GIT_PREFIX):
        repo, asked = _git_spec(spec)
        root = _git_checkout(repo, asked)
    else:
        p = Path(spec).expanduser()
        if not p.exists():
            raise DevicelabError(f"llama.cpp source {spec} does not exist; give a checkout path or '{DEFAULT_SOURCE}'")
        root = _extract_sdist(p) if p.is_file() and p.name.endswith(".tar.gz") else p
    tree = _locate_tree(root.resolve())
    cache = tree / ".devicelab-source.json"
    got = _git_commit(tree)
    if got is None:
        raise DevicelabError(f"cannot read the commit of {tree} (no git metadata); use a git checkout of llama.cpp")
    commit, dirty = got
    if spec.startswith(GIT_PREFIX):  # the worktree may hold another revision already: this one is what was asked
        commit, dirty = asked, False
    src = SourceTree(path=tree, commit=commit, origin=spec, dirty=dirty)
    try:
        cache.write_text(json.dumps(src.to_json(), indent=1))
    except OSError:
        pass
    return src
