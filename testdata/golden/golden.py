"""make golden's driver: the cases of cases.py with two aft binaries, compared.

    python3 -B testdata/golden/golden.py --ref REF_AFT --cur CUR_AFT --work build/golden [-j N] [--only SUBSTR]

Writes the seeded inputs (inputs.py) to WORK/inputs, then runs every case
with each binary in its own scratch directory, WORK/run/{ref,cur}/CASE,
which holds `in` (the inputs) and `td` (testdata/) as symbolic links, so
both binaries see the same relative file names and print the same
messages. For each step of a case it compares the exit status, stdout and
stderr byte for byte, and at the end every file the case left in its
directory; timing outputs (a case's `keys`) are compared by their JSON keys
only, and a case's `ignore` names streams left out. A failing case's
directories and streams are kept in WORK/diff/CASE/{ref,cur}; one line says
what differs. The last line is `golden: N passed, M failed`; the exit status
is 1 when M > 0.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import cases
import inputs

TESTDATA = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300
LINKS = ("in", "td")
# variables aft reads that would change what it computes: cases set them
SCRUB = ("AFT_LINEAR_BLAS", "AFT_DENSE_BLAS")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


# what one command of a case gave: exit status ("timeout" past TIMEOUT), stdout, stderr
Step = collections.namedtuple("Step", "status out err")


def split(step):
    """A step's words and its stdin file ('... < FILE' at the end)."""
    words = shlex.split(step)
    if len(words) >= 2 and words[-2] == "<":
        return words[:-2], words[-1]
    return words, None


def run_side(case, aft, cwd, inputs_dir):
    """Runs a case's steps with one binary in a fresh cwd; its Steps and files."""
    shutil.rmtree(cwd, ignore_errors=True)
    os.makedirs(cwd)
    os.symlink(inputs_dir, os.path.join(cwd, "in"))
    os.symlink(TESTDATA, os.path.join(cwd, "td"))
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env.update(case.env)
    prefix = [aft]
    if case.mpi:
        env.update(MPI_ENV)
        prefix = ["mpirun", "--oversubscribe", "-np", str(case.mpi), aft]
    steps = []
    for step in case.steps:
        words, stdin = split(step)
        fin = open(os.path.join(cwd, stdin), "rb") if stdin else subprocess.DEVNULL
        try:
            p = subprocess.run(prefix + words, cwd=cwd, env=env, stdin=fin,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT)
            err = p.stderr
            if case.mpi:   # mpirun's own reports name its job ids: keep aft's lines
                err = b"".join(l for l in err.splitlines(True) if l.startswith(b"aft"))
            steps.append(Step(p.returncode, p.stdout, err))
        except subprocess.TimeoutExpired as e:
            steps.append(Step("timeout", e.stdout or b"", e.stderr or b""))
        finally:
            if stdin:
                fin.close()
    return steps, files_in(cwd)


def files_in(cwd):
    """Every file a case left in its directory, by relative name (os.walk does
    not follow the links in/ and td/)."""
    out = {}
    for root, _, names in os.walk(cwd):
        for n in names:
            path = os.path.join(root, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, cwd)] = f.read()
    return out


def key_paths(data):
    """The JSON keys of a timing output (one document, or one a line), without values."""
    def walk(v, path, acc):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, path + "." + k, acc)
        elif isinstance(v, list):
            for x in v:
                walk(x, path + "[]", acc)
        else:
            acc.add(path)
    acc = set()
    try:
        docs = [json.loads(data)]
    except ValueError:
        docs = []
        for line in data.splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                acc.add("(not JSON) " + line.decode("utf-8", "replace")[:40])
    for d in docs:
        walk(d, "", acc)
    return sorted(acc)


def first_diff(name, a, b):
    n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    return "%s differs from byte %d (%d vs %d bytes)" % (name, n, len(a), len(b))


def same(case, name, a, b):
    """None when a and b count as equal under the case's rules, else what differs."""
    if name in case.ignore:
        return None
    if name in case.keys:
        ka, kb = key_paths(a), key_paths(b)
        if ka == kb:
            return None
        return "%s keys differ: ref only %s, cur only %s" % (
            name, sorted(set(ka) - set(kb))[:3], sorted(set(kb) - set(ka))[:3])
    return None if a == b else first_diff(name, a, b)


def compare(case, ref, cur):
    """What differs between the two sides' runs of a case, as short phrases."""
    (rsteps, rfiles), (csteps, cfiles) = ref, cur
    diffs = []
    for i, (r, c) in enumerate(zip(rsteps, csteps)):
        at = " (step %d: aft %s)" % (i + 1, case.steps[i][:60]) if len(case.steps) > 1 else ""
        if r.status != c.status:
            diffs.append("exit status %s vs %s%s" % (r.status, c.status, at))
        for name, a, b in (("stdout", r.out, c.out), ("stderr", r.err, c.err)):
            d = same(case, name, a, b)
            if d:
                diffs.append(d + at)
    for name in sorted(set(rfiles) | set(cfiles)):
        if name not in cfiles or name not in rfiles:
            diffs.append("%s only in %s" % (name, "ref" if name in rfiles else "cur"))
            continue
        d = same(case, name, rfiles[name], cfiles[name])
        if d:
            diffs.append(d)
    return diffs


def keep(case, work, sides):
    """Moves a failing case's directories to WORK/diff/CASE, with each step's streams."""
    dest = os.path.join(work, "diff", case.name)
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for side, (steps, _) in sides.items():
        src = os.path.join(work, "run", side, case.name)
        for link in LINKS:
            os.unlink(os.path.join(src, link))
        shutil.move(src, os.path.join(dest, side))
        for i, s in enumerate(steps):
            base = os.path.join(dest, "%s.step%d." % (side, i + 1))
            for ext, data in (("stdout", s.out), ("stderr", s.err), ("status", str(s.status).encode() + b"\n")):
                with open(base + ext, "wb") as f:
                    f.write(data)
    with open(os.path.join(dest, "steps"), "w") as f:
        f.write("".join("aft %s\n" % s for s in case.steps))


def run_case(case, args, inputs_dir):
    sides = {}
    for side, aft in (("ref", args.ref), ("cur", args.cur)):
        sides[side] = run_side(case, aft, os.path.join(args.work, "run", side, case.name), inputs_dir)
    diffs = compare(case, sides["ref"], sides["cur"])
    if diffs:
        keep(case, args.work, sides)
    else:
        for side in sides:
            shutil.rmtree(os.path.join(args.work, "run", side, case.name))
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the reference aft")
    ap.add_argument("--cur", required=True, help="the aft under test")
    ap.add_argument("--work", required=True, help="scratch directory (inputs, run, diff)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="cases at a time (default 1)")
    ap.add_argument("--only", help="run the cases whose name holds this string")
    args = ap.parse_args()
    args.ref, args.cur, args.work = (os.path.abspath(p) for p in (args.ref, args.cur, args.work))

    todo = [c for c in cases.CASES if not args.only or args.only in c.name]
    if any(c.mpi for c in todo) and not shutil.which("mpirun"):
        print("golden: no mpirun: skipping %d MPI cases" % sum(1 for c in todo if c.mpi))
        todo = [c for c in todo if not c.mpi]
    inputs_dir = os.path.join(args.work, "inputs")
    shutil.rmtree(inputs_dir, ignore_errors=True)
    shutil.rmtree(os.path.join(args.work, "diff"), ignore_errors=True)
    shutil.rmtree(os.path.join(args.work, "run"), ignore_errors=True)
    inputs.make(inputs_dir)

    start, failed = time.time(), 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for case, diffs in zip(todo, pool.map(lambda c: run_case(c, args, inputs_dir), todo)):
            if diffs:
                failed += 1
                print("golden: FAIL %s: %s" % (case.name, "; ".join(diffs)), flush=True)
    if failed:
        print("golden: the failing cases' outputs are in %s" % os.path.join(args.work, "diff"))
    print("golden: %d cases in %.0f s" % (len(todo), time.time() - start))
    print("golden: %d passed, %d failed" % (len(todo) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
