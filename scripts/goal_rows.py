#!/usr/bin/env python3
"""Issue 19's goal table in one command: every decode row measured by `onepass bench`, one run a
row on synthetic files it writes itself, printed as a Markdown table beside each row's goal.

    python3 scripts/goal_rows.py                      # every row on the CUDA backend
    python3 scripts/goal_rows.py --only 8b --repeat 3 # the rows whose key has "8b"

Each row runs `onepass bench --backend B --modes graph -n N --repeat R --json --like SHAPE
--quant Q [--rope-freqs] [--head H] -p P` and reads its JSON: the median decode tokens a
second with the repeats' range, the device time a step and the weights a step reads over it.
The long-context rows are held to 90% of their own row at the short prompt, and the Q4_K rows
to 90% of the Q4_0 row's bytes a second (tokens a second times the weights a step reads), so
those rows need their reference row in the same run (`--only` keeps it in).

    python3 scripts/goal_rows.py --save before.json          # on the build before a change
    python3 scripts/goal_rows.py --before before.json        # after it: a before column beside

`--save FILE` writes the device and every row's figures as JSON; `--before FILE` reads such a
file first and puts each row's earlier tok/s and the ratio to it beside the new figure (the
issue asks for the figure before a change beside the one after it, on the same device).

    python3 scripts/goal_rows.py --only 8b- --against old/onepass --rounds 3

`--against OLD` measures a change in one run: each row runs OLD and then the binary, alternately,
`--rounds` times, and a table of the two binaries' figures and their ratio replaces the goal
table (both must find their kernels; on the GPU machine, one kernel cache filled by both).
"""

import argparse
import json
import subprocess
import sys

# key, label, bench arguments, long prompt?, goal: tok/s, or (kind, reference key).
ROWS = [
    ("8b", "Llama-3.1-8B Q4_0", ["--like", "llama-3.1-8b", "--quant", "q4_0"], False, 570.0),
    ("8b-ff", "8B Q4_0 with `rope_freqs`", ["--like", "llama-3.1-8b", "--quant", "q4_0", "--rope-freqs"], False, 570.0),
    ("1b", "Llama-3.2-1B Q4_0", ["--like", "llama-3.2-1b", "--quant", "q4_0"], False, 2000.0),
    ("1b-ff", "1B Q4_0 with `rope_freqs`", ["--like", "llama-3.2-1b", "--quant", "q4_0", "--rope-freqs"], False, 2000.0),
    ("smollm2", "SmolLM2-135M Q4_1", ["--like", "smollm2"], False, 2000.0),
    ("8b-ff-long", "8B with `rope_freqs`, long prompt", ["--like", "llama-3.1-8b", "--quant", "q4_0", "--rope-freqs"], True, ("context", "8b-ff")),
    ("1b-ff-long", "1B with `rope_freqs`, long prompt", ["--like", "llama-3.2-1b", "--quant", "q4_0", "--rope-freqs"], True, ("context", "1b-ff")),
    ("smollm2-long", "SmolLM2, long prompt", ["--like", "smollm2"], True, ("context", "smollm2")),
    ("8b-q4k", "8B Q4_K", ["--like", "llama-3.1-8b", "--quant", "q4_k"], False, ("bytes", "8b")),
    ("8b-q4k-q6k", "8B Q4_K, Q6_K head", ["--like", "llama-3.1-8b", "--quant", "q4_k", "--head", "q6_k"], False, ("bytes", "8b")),
    ("8b-q4k-q8", "8B Q4_K, Q8_0 head", ["--like", "llama-3.1-8b", "--quant", "q4_k", "--head", "q8_0"], False, ("bytes", "8b")),
]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="target/release/onepass", help="the onepass binary")
    p.add_argument("--backend", default="cuda", help="the backend bench runs on (default cuda)")
    p.add_argument("--only", default="", help="run the rows whose key contains this text")
    p.add_argument("--prompt", type=int, default=512, help="the short prompt (default 512)")
    p.add_argument("--long", type=int, default=4096, help="the long prompt (default 4096)")
    p.add_argument("--decode", type=int, default=64, help="decode steps a repeat (default 64)")
    p.add_argument("--repeat", type=int, default=2, help="measured repeats (default 2)")
    p.add_argument("--save", default="", help="write the device and each row's figures to this JSON file")
    p.add_argument("--before", default="", help="a file --save wrote: show its tok/s beside each row")
    p.add_argument("--against", default="", help="another onepass binary: each row runs it and --bin alternately")
    p.add_argument("--rounds", type=int, default=2, help="with --against: runs of each binary a row (default 2)")
    args = p.parse_args(argv)
    if args.against and (args.save or args.before):
        p.error("--against prints no goal table: --save and --before go with the goal table")
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: at least one run of each binary is needed")
    return args


# The figures of a bench row that --save keeps.
SAVED = ("decode_tok_s", "decode_tok_s_spread", "gpu_us_per_token", "decode_weight_bytes", "decode_tb_per_s")


def load_before(path):
    """The rows and device of a file --save wrote, or an exit naming what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        sys.exit(f"goal_rows: --before {path}: cannot read it ({e.strerror})")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        sys.exit(f"goal_rows: --before {path}: not JSON ({e})")
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, dict) or not all(
            isinstance(r, dict) and isinstance(r.get("decode_tok_s"), (int, float)) for r in rows.values()):
        sys.exit(f"goal_rows: --before {path}: not a file `--save` wrote (no \"rows\" of figures)")
    return rows, data.get("device")


def save(path, device, results, prompts):
    """Writes what load_before reads: the device and each row's saved figures with its prompt."""
    rows = {k: {**{f: got[f] for f in SAVED if f in got}, "prompt": prompts[k]} for k, got in results.items()}
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)
            f.write("\n")
    except OSError as e:
        sys.exit(f"goal_rows: --save {path}: cannot write it ({e.strerror})")


def run_row(args, bench_args, prompt, binary=None):
    cmd = [binary or args.bin, "bench", "--backend", args.backend, "--modes", "graph", "-n", str(args.decode),
           "--repeat", str(args.repeat), "--json", *bench_args, "-p", str(prompt)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"goal_rows: cannot run {cmd[0]} ({e.strerror})")
    if done.returncode != 0:
        sys.exit(f"goal_rows: `{' '.join(cmd)}` failed ({done.returncode}):\n{done.stderr.strip()}")
    try:
        return json.loads(done.stdout)[0], " ".join(cmd[1:])
    except (json.JSONDecodeError, IndexError) as e:
        sys.exit(f"goal_rows: `{' '.join(cmd)}` gave no JSON result ({e}):\n{done.stdout[:400]}")


def verdict(row, got, results):
    """The goal column and whether it holds, for one measured row."""
    key, _, _, _, goal = row
    if isinstance(goal, float):
        share = got["decode_tok_s"] / goal
        return f"{goal:,.0f}", f"{'yes' if share >= 1 else 'no'} ({share:.0%})"
    kind, ref_key = goal
    ref = results.get(ref_key)
    if ref is None:
        return "-", f"no: row {ref_key} was not run"
    if kind == "context":
        share = got["decode_tok_s"] / ref["decode_tok_s"]
        return f"90% of {ref_key}", f"{'yes' if share >= 0.9 else 'no'} ({share:.1%})"
    rate = got["decode_tok_s"] * got["decode_weight_bytes"]
    share = rate / (ref["decode_tok_s"] * ref["decode_weight_bytes"])
    return f"90% of {ref_key}'s bytes/s", f"{'yes' if share >= 0.9 else 'no'} ({share:.1%})"


def compare(args, rows):
    """--against: each row's two binaries run alternately, their figures side by side."""
    lines, device = [], None
    for key, label, bench_args, long_prompt, _ in rows:
        prompt = args.long if long_prompt else args.prompt
        # Kept apart by role, not by path: a binary measured against itself is a fair check.
        old, new = [], []
        for r in range(args.rounds):
            for binary, got_runs in ((args.against, old), (args.bin, new)):
                print(f"goal_rows: {key} ({prompt}-token prompt), {binary}, round {r + 1} ...",
                      file=sys.stderr, flush=True)
                got, _ = run_row(args, bench_args, prompt, binary)
                got_runs.append(got)
                device = device or got.get("device")
        mean = lambda got, f: sum(g[f] for g in got) / len(got)
        each = lambda got: " / ".join(f"{g['decode_tok_s']:,.1f}" for g in got)
        lines.append(f"| {key} | {label} ({prompt}) | {each(old)} | {each(new)} | "
                     f"{mean(new, 'decode_tok_s') / mean(old, 'decode_tok_s'):.3f}x | "
                     f"{mean(old, 'gpu_us_per_token'):,.1f} -> {mean(new, 'gpu_us_per_token'):,.1f} |")
    print(f"device: {device}; `bench --backend {args.backend} --modes graph -n {args.decode} "
          f"--repeat {args.repeat} --json ...`, each binary {args.rounds} times a row, alternately")
    print(f"against: {args.against}; new: {args.bin}")
    print()
    print("| key | decode, batch 1 (prompt) | against tok/s | new tok/s | new / against | us a step |")
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(lines))


def main(argv):
    args = parse_args(argv)
    rows = [r for r in ROWS if args.only in r[0]]
    if not rows:
        sys.exit(f"goal_rows: no row's key contains {args.only!r}; keys: {', '.join(r[0] for r in ROWS)}")
    if args.against:
        compare(args, rows)
        return
    before, before_device = load_before(args.before) if args.before else (None, None)
    results, prompts, lines, device = {}, {}, [], None
    for row in rows:
        key, label, bench_args, long_prompt, _ = row
        prompt = args.long if long_prompt else args.prompt
        print(f"goal_rows: {key} ({prompt}-token prompt) ...", file=sys.stderr, flush=True)
        got, cmd = run_row(args, bench_args, prompt)
        results[key], prompts[key] = got, prompt
        device = device or got.get("device")
        spread = got["decode_tok_s_spread"]
        goal, holds = verdict(row, got, results)
        line = (f"| {key} | {label} ({prompt}) | {got['decode_tok_s']:,.1f} "
                f"[{spread['min']:,.1f}-{spread['max']:,.1f}] | ")
        if before is not None:
            b = before.get(key)
            if b is None:
                line += "- | "
            elif b.get("prompt", prompt) != prompt:
                line += f"- (before at a {b['prompt']}-token prompt) | "
            else:
                line += f"{b['decode_tok_s']:,.1f} ({got['decode_tok_s'] / b['decode_tok_s']:.3f}x) | "
        lines.append(line + f"{got['gpu_us_per_token']:,.0f} | {got['decode_weight_bytes'] / 1e9:.2f} | "
                     f"{got['decode_tb_per_s']:.2f} | {goal} | {holds} |")
        print(f"goal_rows: {key}: {got['decode_tok_s']:,.1f} tok/s  ({cmd})", file=sys.stderr, flush=True)
    if args.save:
        save(args.save, device, results, prompts)
    print(f"device: {device}; `bench --backend {args.backend} --modes graph -n {args.decode} "
          f"--repeat {args.repeat} --json ...`, the median of the repeats and their range")
    if before is not None:
        other = "" if before_device == device else " (another device: the ratios compare two machines)"
        print(f"before: {args.before}, measured on {before_device}{other}")
    print()
    extra = ("before tok/s (now / before) | ", "---:|") if before is not None else ("", "")
    print(f"| key | decode, batch 1 (prompt) | tok/s [range] | {extra[0]}us a step | GB a step | TB/s | goal | holds? |")
    print(f"|---|---|---:|{extra[1]}---:|---:|---:|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
