"""How much of each standard task a cache budget covers: the token length of every loglikelihood request
(context + continuation in one encoding, SmolLM2's tokenizer; lm-eval encodes the two apart, which can move
a length by a token) of the suite's own lm-eval tasks, and the share longer than each
budget. A request no longer than the budget (sinks + window + retention slots) never puts a token into the linear
state: on it a linearized model is the frozen model's softmax attention, over q/k/v that a trained short conv or
LoRA may have changed (docs/study.md, "What the standard suites measure").

    python scripts/study/prompt_lengths.py [--budgets 64,128] [--data-dir DIR]
"""
import argparse
import os
import statistics

os.environ.setdefault("TQDM_DISABLE", "1")  # lm-eval's and datasets' progress bars

from golinear.bench.run.execute import build_task_manager
from golinear.models.backbones.backbone import load_tokenizer
from golinear.tasks.standard import suite_tasks

TASKS = suite_tasks("cr") + suite_tasks("lambada")  # tasks.standard.SUITES: the suites' own task lists


def request_lengths(task, tok) -> list[int]:
    task.build_all_requests(limit=None, rank=0, world_size=1)
    return [len(tok(ctx + cont)["input_ids"]) for ctx, cont in (inst.args for inst in task.instances)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budgets", default="64,128")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()
    from lm_eval.tasks import get_task_dict
    budgets = [int(b) for b in args.budgets.split(",")]
    tok = load_tokenizer("smollm2-135m")
    tasks = get_task_dict(TASKS, build_task_manager(args.data_dir, tasks=TASKS))
    print("| task | requests | median tokens | max | " + " | ".join(f"> {b} tokens" for b in budgets) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(budgets))
    for name in TASKS:
        n = request_lengths(tasks[name], tok)
        over = " | ".join(f"{100 * sum(x > b for x in n) / len(n):.1f} %" for b in budgets)
        print(f"| {name} | {len(n)} | {statistics.median(n):.0f} | {max(n)} | {over} |")


if __name__ == "__main__":
    main()
