"""`golinear train` on the command line (options: models.training.cli_args): data preparation, loading (whole or
sharded), the held-out losses, the run record (`train_config.json`), checkpoint and plot; the loop is
models.training.train."""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import time
from pathlib import Path

import torch

from golinear.models.training import data as data_mod
from golinear.models.training import resume_state, train_settings
from golinear.models.training.cli_args import train as add_arguments  # noqa: F401 - the options, apart (no torch for --help)
from golinear.models.spec import CONV_ON
from golinear.models.training.train import CONFIG_FILE, LOG_FILE, PLOT_FILE, STATE_FILE, Trainer, TrainConfig
from golinear.models.training.train_fsdp import fsdp_settings, load_sharded
from golinear.models.training.train_utils import atomic_write_json, heldout_loss, plot_loss, read_json, read_log, seed_everything


def linearize_options(args) -> dict:
    """The model flags as LinearizeConfig options, each value checked by models.spec (one message per value)."""
    from golinear.models.spec import ModelSpec
    return ModelSpec.from_train_args(args).linearize_options()


def run_name(opts: dict) -> str:
    parts = [opts["mechanism"]]
    if opts["window"]:
        parts.append(f"w{opts['window']}")
    if opts["sinks"]:
        parts.append(f"s{opts['sinks']}")
    if opts.get("retain"):
        parts.append(f"r{opts['retain']}-{opts['retain_score']}")
    if opts.get("out_norm"):
        parts.append("onorm")
    if opts["short_conv"]:
        parts.append("sc")
    if opts.get("conv_on", CONV_ON[0]) != CONV_ON[0]:
        parts.append(f"conv{opts['conv_on'][:3]}")
    if opts["lora"]:
        parts.append("lora" if opts.get("lora_rank", 8) == 8 else f"lora-r{opts['lora_rank']}")
    return "-".join(parts)


def train_config_from_args(args) -> TrainConfig:
    return TrainConfig(seq_len=args.seq_len, batch_size=args.batch_size, steps=args.steps, lr=args.lr,
                       lora_lr=args.lora_lr, weight_decay=args.weight_decay, warmup_steps=args.warmup_steps,
                       min_lr_ratio=args.min_lr_ratio, grad_clip=args.grad_clip, seed=args.seed,
                       save_every=args.save_every, save_every_s=args.save_every_s, log_every=args.log_every,
                       eval_sequences=args.eval_sequences,
                       time_budget_s=args.time_budget_s, stop_after=args.stop_after, stop_at_s=args.stop_at_s,
                       bf16=args.bf16, cuda_graph=args.cuda_graph, distill=args.distill,
                       transfer_steps=args.transfer_steps)


def load_token_data(args, tokenizer, train_tokens: int, heldout_tokens: int) -> data_mod.TokenData:
    if args.tokens and Path(args.tokens).exists():
        td = data_mod.TokenData.load(args.tokens)
        fp = data_mod.tokenizer_fingerprint(tokenizer)
        if td.meta.get("tokenizer_fingerprint") != fp:
            raise ValueError(f"token file {args.tokens!r} was made with tokenizer {td.meta.get('tokenizer')!r} "
                             f"({td.meta.get('tokenizer_fingerprint')}), not this backbone's ({fp})")
        return td
    if args.dataset:
        td = data_mod.prepare_hf(tokenizer, args.dataset, args.dataset_config, args.dataset_split, args.text_field,
                                 args.dataset_files, train_tokens=train_tokens, heldout_fraction=args.heldout_fraction,
                                 heldout_tokens=heldout_tokens, seed=args.seed)
    else:
        td = data_mod.prepare_books(tokenizer, args.data_dir, train_tokens=train_tokens, heldout_docs=args.heldout_docs,
                                    heldout_tokens=heldout_tokens, seed=args.seed)
    if args.tokens:
        td.save(args.tokens)
    return td


def main(args) -> int:
    from accelerate import Accelerator
    from golinear.models.backbones.backbone import load_backbone, load_tokenizer

    t_start = time.perf_counter()  # a time budget counts from here (model loading and evals included)
    cfg = train_config_from_args(args)
    cfg.validate()
    opts = linearize_options(args)
    out = Path(args.out or Path("runs") / "train" / run_name(opts))
    # the launch itself first (the launcher's WORLD_SIZE; a plain run has 1 process), then the inputs: both before
    # any data preparation, model loading or folder creation
    fsdp_settings(getattr(args, "fsdp", False), int(os.environ.get("WORLD_SIZE", "1")))
    check_inputs(args, opts)
    if not args.force:
        resume_state.refuse_legacy(out)
        if (out / STATE_FILE).exists():  # its JSON, before any model loads (a damaged one would fail after)
            resume_state.check(out / STATE_FILE)
    if not args.prepare_only and finished_run(out, args, cfg, opts):
        return 0
    acc = Accelerator(cpu=not torch.cuda.is_available())
    fsdp = fsdp_settings(getattr(args, "fsdp", False), acc.num_processes)
    if fsdp and opts.get("out_norm"):
        raise ValueError("--out-norm with --fsdp: the output-norm calibration runs on a whole model; "
                         "train on one process or data parallel")
    if fsdp and acc.mixed_precision != "no":
        raise ValueError(f"mixed_precision {acc.mixed_precision!r} with FSDP: golinear autocasts itself (--bf16, on "
                         "by default on GPU); set mixed_precision: 'no' in the accelerate config")
    needed = cfg.steps * cfg.batch_size * acc.num_processes * cfg.seq_len + cfg.seq_len
    train_tokens = args.prepare_train_tokens or needed
    heldout_tokens = cfg.eval_sequences * cfg.seq_len
    if args.prepare_only:
        if not args.tokens:
            raise ValueError("--prepare-only needs --tokens FILE")
        td = load_token_data(args, load_tokenizer(args.base), train_tokens, heldout_tokens)
        print(json.dumps({k: v for k, v in td.meta.items() if k != "heldout_ids"}))
        return 0

    from golinear.models.checkpoint.weights import save_checkpoint
    from golinear.models.attention.linearize import LinearizeConfig, linearize
    from golinear.models.checkpoint.model_card import write_card

    out.mkdir(parents=True, exist_ok=True)
    lin_cfg = LinearizeConfig.from_dict(opts)
    if acc.is_main_process:
        if args.force:  # start over: the old state and log go, the checkpoint is replaced
            (out / STATE_FILE).unlink(missing_ok=True)
            (out / resume_state.LEGACY_STATE_FILE).unlink(missing_ok=True)
            (out / LOG_FILE).unlink(missing_ok=True)
        if args.force or not (out / STATE_FILE).exists():  # a new run: these are its settings from now on
            atomic_write_json(out / train_settings.SETTINGS_FILE,
                              train_settings.settings(args, cfg, lin_cfg.to_dict()))
    acc.wait_for_everyone()
    if acc.is_main_process:  # the tokenizer-and-pack step runs once; other ranks read the token file
        td = load_token_data(args, load_tokenizer(args.base), train_tokens, heldout_tokens)
    acc.wait_for_everyone()
    if not acc.is_main_process:
        td = load_token_data(args, load_tokenizer(args.base), train_tokens, heldout_tokens)
    sequences = data_mod.PackedSequences(td.train, cfg.seq_len, seed=cfg.seed)
    heldout = data_mod.heldout_sequences(td.heldout, cfg.seq_len, cfg.eval_sequences)

    bf16 = cfg.bf16 if cfg.bf16 is not None else acc.device.type == "cuda"
    resuming = (out / STATE_FILE).exists()
    previous = read_json(out / CONFIG_FILE) if resuming and (out / CONFIG_FILE).exists() else {}
    full_loss = previous.get("results", {}).get("heldout_loss_full_attention")
    if fsdp:
        model, attention_modules = load_sharded(args.base, lin_cfg, cfg.seed, acc, fsdp)
    else:
        model, _ = load_backbone(args.base, dtype="float32", device=acc.device)
        if full_loss is None and acc.is_main_process:
            full_loss = heldout_loss(model, heldout, acc.device, bf16)
        seed_everything(cfg.seed)  # new-parameter initialisation is a function of the seed
        linearize(model, lin_cfg, base_name=args.base)
    meta = {}
    if lin_cfg.out_norm:  # before the init loss; deterministic, and a resume then loads the trained weights
        from golinear.models.training.out_norm_calibration import calibrate_out_norm
        meta["out_norm_calibration"] = calibrate_out_norm(model, sequences.batch(0, cfg.batch_size).to(acc.device),
                                                          bf16)
    init_loss = previous.get("results", {}).get("heldout_loss_init")
    data_meta = {k: v for k, v in td.meta.items()}
    data_meta.update(sequences=sequences.num, seq_len=cfg.seq_len,
                     epochs=round(sequences.epochs_for(cfg.steps * cfg.batch_size * acc.num_processes), 4))
    t_eval = time.perf_counter()
    if init_loss is None and acc.is_main_process and not fsdp:
        init_loss = heldout_loss(model, heldout, acc.device, bf16)
    trainer = Trainer(model, sequences, cfg, out, accelerator=acc, meta={"data": data_meta, **meta})
    if fsdp:  # the sharded model is evaluated by all ranks together
        t_eval = time.perf_counter()
        if full_loss is None:
            full_loss = trainer.evaluate(heldout, attention_modules=attention_modules)
        if init_loss is None:
            init_loss = trainer.evaluate(heldout)
    eval_s = time.perf_counter() - t_eval  # includes kernel compilation on a fresh GPU: capped below
    if cfg.time_budget_s and not resuming:  # leave time for the final evaluation and saving
        trainer.deadline = t_start + cfg.time_budget_s - (min(eval_s, 30.0) + 10.0)
    trainer.try_resume()
    trainer.catch_sigterm()  # a deadline's TERM ends the run resumably (a scheduler's deadline)
    summary = trainer.train()
    results = {"heldout_loss_full_attention": full_loss, "heldout_loss_init": init_loss,
               "heldout_sequences": int(heldout.shape[0]), "heldout_tokens_scored": int(heldout.numel() - heldout.shape[0])}
    record = {"command": "golinear train", "base": args.base, "linearize": lin_cfg.to_dict(), "train": dataclasses.asdict(cfg),
              "data": data_meta, "seeds": {"init": cfg.seed, "data_order": cfg.seed, "heldout": "hash rule, no seed"},
              "note": args.note, "environment": environment(acc, fsdp), "summary": summary, "results": results}
    if lin_cfg.out_norm:
        record["out_norm_calibration"] = trainer.meta.get("out_norm_calibration")
    if not summary["finished"]:
        if acc.is_main_process:
            atomic_write_json(out / CONFIG_FILE, record)
            why = {signal.SIGINT: " by Ctrl-C", signal.SIGTERM: " by SIGTERM"}.get(trainer.stop_signal, "")
            print(f"golinear train: stopped{why} at step {summary['step']}/{summary['total_steps']}, state saved; "
                  "re-run the same command to resume", flush=True)
        return 128 + trainer.stop_signal if trainer.stop_signal else 0  # a signal stopped it early: not a success
    if fsdp or acc.is_main_process:  # under FSDP every rank takes part in the forward and the gathering
        results["heldout_loss_trained"] = trainer.evaluate(heldout)
        new_params = trainer.full_new_parameters()
    if acc.is_main_process:
        record["summary"]["total_wall_s_this_invocation"] = round(time.perf_counter() - t_start, 2)
        record["new_parameters"] = int(sum(p.numel() for p in trainer.named.values()))
        save_checkpoint(model, out, tensors=new_params,
                        extra={"training": {k: record[k] for k in ("train", "seeds", "note", "summary", "results")}})
        atomic_write_json(out / CONFIG_FILE, record)
        plot_loss(read_log(out / LOG_FILE), out / PLOT_FILE,
                  title=f"{args.base} {run_name(opts)}: {summary['tokens'] / 1e6:.1f}M tokens",
                  heldout={"held-out, full attention": full_loss, "held-out, linearized (trained)":
                           results["heldout_loss_trained"], "held-out, linearized (init)": init_loss})
        write_card(out)  # the model card; `golinear cards` adds the scores once they are in a result store
        if not args.keep_state and (out / STATE_FILE).exists():
            (out / STATE_FILE).unlink()
        print(json.dumps({"out": str(out), **results, "tokens": summary["tokens"],
                          "train_wall_s": summary["train_wall_s"], "tokens_per_s": summary["tokens_per_s"]}))
    acc.wait_for_everyone()
    return 0


def check_inputs(args, opts: dict) -> None:
    """Everything checkable without weights: linearize options against the backbone's config, the token
    file or the books corpus (present, matching the data folder's SHA256SUMS, gzip complete)."""
    from golinear.models.training.data_hashes import verify_files
    from golinear.models.spec.backbone_checks import check_linearize
    check_linearize(opts, args.base)
    if args.tokens and Path(args.tokens).exists():
        return
    if args.dataset is None:
        data_dir = data_mod.resolve_data_dir(args.data_dir)
        verify_files(data_mod.book_files(data_dir), data_dir)


def finished_run(out: Path, args, cfg: TrainConfig, opts: dict) -> bool:
    """True (and says so) when `out` holds a finished run of these settings: re-running it is a no-op.

    A finished or unfinished (resumable) run of other settings is an error naming each differing setting (use
    another --out, or --force to start over); models.training.train_settings says which settings count."""
    from golinear.models.attention.linearize import LinearizeConfig
    if args.force:
        return False
    want = train_settings.settings(args, cfg, LinearizeConfig.from_dict(opts).to_dict())
    record_path = out / CONFIG_FILE
    record = read_json(record_path) if record_path.exists() else None
    finished = bool(record and (record.get("summary") or {}).get("finished")
                    and (out / "new_params.safetensors").exists())
    if finished:
        train_settings.refuse_other_settings(out, want, train_settings.recorded(out, record), "a finished run")
        s = record["summary"]
        print(f"golinear train: {out} already holds this finished run ({s.get('step')} steps, "
              f"{s.get('tokens')} tokens); nothing to do (--force trains it again)")
        return True
    if (out / STATE_FILE).exists():  # a killed or stopped run this command would resume
        train_settings.refuse_other_settings(out, want, train_settings.recorded(out, record), "an unfinished run")
    return False


def environment(acc, fsdp: dict | None = None) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": str(acc.device),
           "processes": acc.num_processes, "fsdp": fsdp}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    return env
