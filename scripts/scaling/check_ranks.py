"""Every rank builds the same random-weight backbone: each builds it (models.backbones.random_base, on its own device)
and the ranks compare weight fingerprints through an all-gather. Prints one JSON line on rank 0; exit 1 if the
ranks differ.

    torchrun --nproc_per_node 2 scripts/scaling/check_ranks.py BASE_FOLDER [OUT_JSON]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist
    from golinear.models.backbones.backbone import fingerprint, load_backbone
    cuda = torch.cuda.is_available()
    rank = int(os.environ.get("RANK", "0"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        model, _ = load_backbone(argv[0], dtype="float32", device=device)
        mine = fingerprint(model)
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        dist.barrier()  # no rank tears its gloo pairs down while a peer still reads from them (SIGABRT at exit)
    finally:
        dist.destroy_process_group()
    same = len(set(everyone)) == 1
    if rank == 0:
        line = json.dumps({"base": argv[0], "fingerprints": everyone, "identical": same})
        print(line)
        if len(argv) > 1:
            Path(argv[1]).write_text(line + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
