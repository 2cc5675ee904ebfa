"""Markdown table of the reference checkpoints (tokens, time, speed, held-out losses) from train_config.json.

Usage: python scripts/train/summarize.py [checkpoints/smollm2-135m]
"""
import json
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "checkpoints/smollm2-135m")
print("| name | recipe | tokens (steps) | train wall s | steady tok/s | held-out CE: full / init / trained |")
print("|---|---|---:|---:|---:|---|")
for folder in sorted(p for p in root.iterdir() if (p / "train_config.json").exists()):
    r = json.loads((folder / "train_config.json").read_text())
    lin, s, res = r["linearize"], r["summary"], r["results"]
    recipe = f"{lin['mechanism']} w{lin['window']} s{lin['sinks']}" + (" +conv" if lin["short_conv"] else "") + \
        (f" on {lin['conv_on']}" if lin["short_conv"] and lin.get("conv_on") else "") + \
        (" +LoRA" if lin["lora"] else "") + (" +out_norm" if lin.get("out_norm") else "") + \
        (f" +retain{lin['retain']} ({lin['retain_score']})" if lin.get("retain") else "") + \
        (f" +{lin['keep_full']:.0%} full ({lin['select']})" if lin.get("keep_full") else "") + \
        (f" +attention transfer {r['train']['transfer_steps']} steps" if r["train"].get("transfer_steps") else "") + \
        (f" +KL {r['train']['distill']}" if r["train"].get("distill") else "")
    print(f"| {folder.name} | {recipe} | {s['tokens']:,} ({s['step']}) | {s['train_wall_s']:.0f} | "
          f"{s['steady_tokens_per_s'] or 0:,.0f} | {res['heldout_loss_full_attention']:.3f} / "
          f"{res['heldout_loss_init']:.3f} / {res['heldout_loss_trained']:.3f} |")
