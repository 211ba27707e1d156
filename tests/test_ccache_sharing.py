"""A build of another folder hits ccache for every unchanged file (bisect's worktree, an older release, a copy of
the tree): each build compiles its tree through the `_src` link in its own binary folder, so the compile commands,
relative to ccache's base_dir, are the same. Real CMake and real ccache on a small C project."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from devicelab.build import cache

pytestmark = pytest.mark.skipif(not (shutil.which("ccache") and shutil.which("cmake")), reason="needs ccache, cmake")


def _tree(at, body: str):
    (at / "inc").mkdir(parents=True)
    (at / "inc" / "x.h").write_text("#define X 1\n")
    (at / "a.c").write_text('#include "x.h"\nconst char *f(void) { return __FILE__; }\nint g(void) { return X; }\n')
    (at / "b.c").write_text(body)
    (at / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.20)\nproject(p C)\nadd_library(p STATIC a.c b.c)\n"
        "target_include_directories(p PRIVATE inc)\n"
    )


def _stats(env) -> tuple[int, int]:
    out = subprocess.run(["ccache", "--print-stats"], env=env, capture_output=True, text=True, check=True).stdout
    n = {k: int(v) for k, v in re.findall(r"^(\w+)\t(\d+)$", out, re.M)}
    hits = n.get("direct_cache_hit", 0) + n.get("preprocessed_cache_hit", 0)
    return hits, n.get("cache_miss", 0)


def _build(home, name, tree, env, launcher):
    d = home / "builds" / name
    link = cache.source_link(d, tree)
    defs = [f"-D{k}={v}" for k, v in launcher.items()]
    subprocess.run(["cmake", "-S", str(link), "-B", str(d), *defs], env=env, check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(d)], env=env, check=True, capture_output=True)
    return d


def test_a_tree_in_another_folder_hits_ccache_but_for_what_changed(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("DEVICELAB_HOME", str(home))
    for k in ("CCACHE_BASEDIR", "CCACHE_DIR", "CCACHE_NOHASHDIR"):
        monkeypatch.delenv(k, raising=False)
    env, launcher = cache.compile_env()
    assert env["CCACHE_BASEDIR"] == str(home) and env["CCACHE_NOHASHDIR"] == "1"
    pinned, worktree = home / "sources" / "pinned" / "vendor" / "llama.cpp", home / "sources" / "git-0123"
    _tree(pinned, "int h(void) { return 1; }\n")
    _tree(worktree, "int h(void) { return 2; }\n")  # one file changed, at another depth and name
    _build(home, "host-aaaa", pinned, env, launcher)
    assert _stats(env) == (0, 2)
    _build(home, "host-bbbb", worktree, env, launcher)
    assert _stats(env) == (1, 3)  # a.c (with its __FILE__) hits; only the changed b.c compiles


def test_the_link_follows_the_tree_and_a_cache_from_another_path_is_dropped(tmp_path):
    d, one, two = tmp_path / "b", tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    link = cache.source_link(d, one)
    assert link == d / "_src" and link.resolve() == one.resolve()
    (d / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={link}\n")
    assert cache.source_link(d, two).resolve() == two.resolve()
    assert (d / "CMakeCache.txt").exists()  # configured through the link: kept
    (d / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={two}\n")
    cache.source_link(d, two)
    assert not (d / "CMakeCache.txt").exists()  # configured from the tree's own path (the old layout)
