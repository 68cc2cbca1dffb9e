"""firmware_scripts/lib/et_sources.sh `et_ccache`: runner builds run their compiles through ccache, so a
compile another runner's build already made is a hit (ExecuTorch's portable kernels in the x86_64 Vulkan
and MLX runners: the MLX runner's cold build took 247 s alone and 56 s after the Vulkan runner's, bundlerun's
own measurement, 2 cores, 2026-12-06). Real ccache and gcc (scripts/setup.sh installs ccache); no doubles."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "firmware_scripts" / "lib" / "et_sources.sh"


def _ccache() -> str:
    path = shutil.which("ccache")
    assert path, "ccache is not installed: scripts/setup.sh installs it (apt-get install ccache)"
    return path


def _dry(script: str, tmp_path: Path, **env: str) -> list[str]:
    src = tmp_path / "et"
    if not src.exists():  # once: the tree's fingerprint (no tarball, no git) counts its files' mtimes
        (src / "runtime").mkdir(parents=True)
        (src / "CMakeLists.txt").write_text("")
    res = subprocess.run(["bash", str(ROOT / script), "--executorch-src", str(src), "--dry-run"], capture_output=True,
                         text=True, env={**os.environ, "BUNDLERUN_CACHE": str(tmp_path / "cache"), **env}, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_the_vulkan_runner_builds_through_ccache_with_the_same_cache_key(tmp_path):
    _ccache()
    script = "firmware_scripts/vulkan/build_vulkan_runner.sh"
    on, off = _dry(script, tmp_path), _dry(script, tmp_path, BUNDLERUN_CCACHE="0")
    configure_on = next(ln for ln in on if ln.startswith("cmake -S")).split()
    configure_off = next(ln for ln in off if ln.startswith("cmake -S")).split()
    launchers = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    assert all(flag in configure_on for flag in launchers)
    assert not any("LAUNCHER" in w for w in configure_off)
    assert on[-1] == off[-1]  # the runner's cached entry: the launcher changes no key


def _compile_in(build: Path, source_text: str, env: dict[str, str]) -> None:
    """One compile as ninja runs it: from `build`/out, of `build`/src/x.c, by absolute path."""
    (build / "src").mkdir(parents=True)
    (build / "out").mkdir()
    (build / "src" / "x.c").write_text(source_text)
    (build / "src" / "x.h").write_text("#define TWICE(v) ((v) * 2)\n")
    subprocess.run(["bash", "-c", f'source "{LIB}"; et_ccache; '
                    f'ccache gcc -O2 -I"{build / "src"}" -c "{build / "src" / "x.c"}" -o x.o'],
                   cwd=build / "out", env=env, check=True, capture_output=True, text=True, timeout=120)


def _stats(env: dict[str, str]) -> str:
    return subprocess.run([_ccache(), "--print-stats"], env={**env, "CCACHE_DIR": env["BUNDLERUN_CACHE"] + "/ccache"},
                          capture_output=True, text=True, check=True).stdout


def _count(stats: str, name: str) -> int:
    return sum(int(line.split("\t")[1]) for line in stats.splitlines() if line.split("\t")[0] == name)


def test_a_compile_another_runners_build_made_is_a_hit(tmp_path):
    _ccache()
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCACHE_")}
    env["BUNDLERUN_CACHE"] = str(cache)
    code = '#include "x.h"\nint f(int v) { return TWICE(v) + 1; }\n'
    _compile_in(cache / "runners" / "aaaa.build", code, env)  # the first runner's build
    first = _stats(env)
    _compile_in(cache / "runners" / "bbbb.build", code, env)  # another runner's, its own source view
    second = _stats(env)
    assert _count(first, "direct_cache_hit") + _count(first, "preprocessed_cache_hit") == 0
    assert _count(second, "direct_cache_hit") + _count(second, "preprocessed_cache_hit") == 1
    _compile_in(cache / "runners" / "cccc.build", code.replace("+ 1", "+ 2"), env)  # a changed source is compiled
    assert _count(_stats(env), "cache_miss") == 2
    assert (cache / "runners" / "cccc.build" / "out" / "x.o").stat().st_size > 0
