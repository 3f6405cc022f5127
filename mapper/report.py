"""The human-readable `hflow map` report of a plan dict (plan.py)."""

from __future__ import annotations

from hflow.mapper.search import STAGES


def _seconds(value: float) -> str:
    return "-" if value == 0 else f"{value:.1f}"


def _parallel(strategy: dict) -> tuple[str, str, str]:
    """(training tp/pp/dp or inference tp/pp/dp, ZeRO stage, generation) columns of one role."""
    if "train" not in strategy and "infer" not in strategy:  # async mode's rollout: generation only
        gen = strategy["generate"]
        waves = f", {gen['waves']} waves" if gen["waves"] > 1 else ""
        engines = f"{gen['replicas']} engine{'s' if gen['replicas'] > 1 else ''}"
        return "generate only", "-", f"tp {gen['tp']}: {engines} of {gen['batch_per_replica']} seqs{waves}"
    main = strategy.get("train") or strategy["infer"]
    layout = f"{'train' if 'train' in strategy else 'infer'} {main['tp']}/{main['pp']}/{main['dp']}"
    zero = str(main["zero_stage"]) + (" +offload" if main.get("offload") else "")
    gen = strategy.get("generate")
    if not gen:
        return layout, zero, ""
    waves = f", {gen['waves']} waves" if gen["waves"] > 1 else ""
    release = ", train state to host" if gen["release_train_state"] else ""
    engines = f"{gen['replicas']} engine{'s' if gen['replicas'] > 1 else ''}"
    return layout, zero, (f"tp {gen['tp']} x micro-DP {gen['micro_dp']}: {engines} of "
                          f"{gen['batch_per_replica']} seqs{waves}{release}")


def _gb(value: float) -> str:
    return f"{value:.1f} GB" if value >= 0.1 else f"{value * 1000:.1f} MB"


def format_plan(plan: dict, source: str) -> str:
    w = plan["workload"]
    lines = [
        f"hflow map {source}: {w['algorithm']}, {w['prompts']} prompts x {w['responses_per_prompt']}, "
        f"{w['prompt_tokens']}+{w['response_tokens']} tokens, {w['optimizer_steps']} optimizer steps per iteration",
        f"cluster: {plan['devices_total']} x {plan['device_spec']}; {plan['gpus_per_node']} per node; "
        f"parallelism {plan['parallel']}",
    ]
    if plan["note"]:
        lines.append(f"note: {plan['note']}")
    lines += ["", _best_line(plan), *_runs_lines(plan), ""]
    header = ("pool", "devices", "role", "model", "tp/pp/dp", "ZeRO", "generation", "gen s", "prep s", "train s")
    rows = []
    for pool in plan["pools"]:
        for i, role in enumerate(pool["roles"]):
            entry = plan["roles"][role]
            layout, zero, gen = _parallel(entry["strategy"])
            secs = entry["seconds"]
            rows.append((pool["name"] if i == 0 else "", str(pool["devices"]) if i == 0 else "", role,
                         entry["model"], layout, zero, gen, *(_seconds(secs[s]) for s in STAGES)))
    lines += _table(header, rows)
    lines.append("")
    for pool in plan["pools"]:
        mem = pool["memory_gb"]
        if pool["roles"] == ["rollout"]:
            lines.append(f"peak memory per device, {pool['name']}: {_gb(mem['generation'])} of weights and KV cache, "
                         f"the whole step (of {mem['usable']:.1f} GB usable, {mem['capacity']:.1f} GB total)")
            continue
        lines.append(f"peak memory per device, {pool['name']}: " + ", ".join(f"{s} {_gb(mem[s])}" for s in STAGES)
                     + f" (of {mem['usable']:.1f} GB usable, {mem['capacity']:.1f} GB total)")
    if "async" in plan:
        lines += _async_lines(plan["async"])
    if plan["placements_fitting"] == 1:
        lines += ["", "runners-up: none, no other placement fits in memory"]
    elif plan["runners_up"]:
        lines += ["", "runners-up (the best plan of each other placement):"]
        rows = [(str(i + 2), r["name"], "+".join(map(str, r["gpus"])),
                 *(f"{r['stage_s'][s]:.1f}" for s in STAGES), f"{r['estimated_iteration_s']:.1f}",
                 f"+{100 * (r['estimated_iteration_s'] / plan['estimated_iteration_s'] - 1):.0f}%")
                for i, r in enumerate(plan["runners_up"])]
        total = "step s" if "async" in plan else "iteration s"
        lines += _table(("#", "placement", "devices", "gen s", "prep s", "train s", total, "vs best"), rows)
    splits = f" x {plan['async']['splits_searched']} rollout pool sizes" if "async" in plan else ""
    lines += ["", f"searched {plan['placements_searched']} placements{splits}, {plan['candidates_evaluated']} "
                  f"allocations, {plan['strategies_simulated']} model strategies in {plan['search_s']:.2f} s"]
    return "\n".join(lines)


def _best_line(plan: dict) -> str:
    stage = plan["stage_s"]
    if "async" in plan:
        a = plan["async"]
        how = "max(generation {:.1f}, training {:.1f})" if a["overlap"] else "generation {:.1f} + training {:.1f}"
        cost = how.format(a["generation_s"], a["training_s"]) + f" + weight sync {_short(a['weight_sync_s'])}"
        per = "s per step, async"
    else:
        cost = " + ".join(f"{s} {stage[s]:.1f}" for s in STAGES)
        per = "s per iteration"
    return (f"best plan: {plan['name']} -- {plan['estimated_iteration_s']:.1f} {per} ({cost}), "
            f"{plan['throughput_tokens_per_s']:,.0f} tokens/s, {plan['devices_used']} of {plan['devices_total']} devices")


def _short(seconds: float) -> str:
    """Weight syncs take milliseconds on NVLink: show them."""
    return f"{seconds:.3f}" if seconds < 0.1 else f"{seconds:.2f}"


def _async_lines(a: dict) -> list[str]:
    """The async step's parts and the comparison with the best synchronous plan."""
    parts = (f"max({a['generation_s']:.1f}, {a['training_s']:.1f})" if a["overlap"]
             else f"{a['generation_s']:.1f} + {a['training_s']:.1f} (max_staleness 0: generation waits for each update)")
    lines = ["",
             f"async: the rollout pool generates for {a['generation_s']:.1f} s on {a['rollout_devices']} device(s) "
             f"while training takes {a['training_s']:.1f} s on {a['training_devices']}; step = {parts} + weight sync "
             f"{_short(a['weight_sync_s'])} s ({_gb(a['weight_sync_gb'])} {a['weight_sync_link']}) = {a['step_s']:.1f} s"]
    if a["sync_step_s"] is None:
        lines.append("sync: no synchronous plan fits memory on these devices")
    else:
        lines.append(f"sync: the best synchronous plan, {a['sync_name']} on {a['sync_devices']} device(s), takes "
                     f"{a['sync_step_s']:.1f} s per step; async speed-up {a['speedup']:.2f}x")
    return lines


def _table(header: tuple, rows: list[tuple]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), *(fmt.format(*row).rstrip() for row in rows)]


def _runs_lines(plan: dict) -> list[str]:
    """Whether `hflow train` runs the best plan as printed (plan.py: what_hflow_runs)."""
    runs = plan["hflow_train"]
    if runs["blocked_by"]:
        return [f"not executable by hflow train: {'; '.join(runs['blocked_by'])}; hflow's engines run ZeRO "
                "data parallelism only (`--parallel zero`, the default, plans what they run)"]
    if runs["needs"]:
        return [f"hflow train runs it with {'; '.join(runs['needs'])}"]
    return []
