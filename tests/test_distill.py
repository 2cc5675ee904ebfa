"""`golinear train --distill W` (models/training/distill.py): the teacher is the backbone itself, the loss mixes
cross-entropy with the KL to it, and training with it moves the student towards the teacher."""
from __future__ import annotations

import pytest
import torch

from _tiny import tiny_llama, tiny_tokenizer, write_books
from golinear.models.attention.linearize import LinearizeConfig, linearize
from golinear.models.training import data as data_mod
from golinear.models.training import train as train_mod
from golinear.models.training.distill import frozen_teacher, kl_to_teacher, training_loss


def linearized(lora: bool = False, seed: int = 0):
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=seed)
    ids = torch.randint(0, len(tok), (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        backbone = model(input_ids=ids).logits
    torch.manual_seed(seed)
    linearize(model, LinearizeConfig.from_dict({"mechanism": "gdn", "window": 8, "sinks": 2, "short_conv": True,
                                                "lora": lora}))
    return model, tok, ids, backbone


@pytest.mark.parametrize("lora", [False, True])
def test_the_teacher_is_the_backbone_before_linearization(lora):
    model, _, ids, backbone = linearized(lora)
    for p in model.parameters():  # move the new parameters (and LoRA) off their initial values
        if p.requires_grad:
            p.data.add_(0.05 * torch.randn_like(p))
    with torch.no_grad(), frozen_teacher(model):
        teacher = model(input_ids=ids).logits
    torch.testing.assert_close(teacher, backbone, atol=2e-5, rtol=2e-5)
    with torch.no_grad():
        student = model(input_ids=ids).logits
    assert (student - backbone).abs().max() > 1e-3  # outside the block the linearized layers run again
    assert not any(getattr(m, "teacher", False) for m in model.modules())


def test_the_loss_mixes_cross_entropy_and_the_kl_to_the_teacher():
    model, _, ids, backbone = linearized()
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
        p, q = torch.softmax(backbone, -1), torch.log_softmax(out.logits, -1)
        kl = (p * (torch.log(p) - q)).sum(-1).mean()  # KL(teacher || student) per position, averaged
        assert kl_to_teacher(out.logits, backbone) == pytest.approx(float(kl), rel=1e-5)
        assert float(training_loss(model, ids, 0.0)) == pytest.approx(float(out.loss), rel=1e-6)
        assert float(training_loss(model, ids, 1.0)) == pytest.approx(float(kl), rel=1e-5)
        assert float(training_loss(model, ids, 0.25)) == pytest.approx(0.75 * float(out.loss) + 0.25 * float(kl),
                                                                        rel=1e-5)


def test_distilling_moves_the_student_towards_the_teacher(tmp_path):
    """The same run with the KL (W = 1) ends nearer the teacher than without it (W = 0), and nearer than it began."""
    tok = tiny_tokenizer()
    td = data_mod.prepare_books(tok, write_books(tmp_path / "data"), heldout_docs=2)
    after = {}
    for w in (0.0, 1.0):
        model, _, ids, backbone = linearized()
        torch.manual_seed(2)
        for p in model.parameters():  # a student away from the teacher
            if p.requires_grad:
                p.data.add_(0.3 * torch.randn_like(p))
        with torch.no_grad():
            before = float(kl_to_teacher(model(input_ids=ids).logits, backbone))
        cfg = train_mod.TrainConfig(seq_len=32, batch_size=2, steps=20, lr=1e-2, save_every=10**6, log_every=5,
                                    eval_sequences=2, distill=w)
        train_mod.Trainer(model, data_mod.PackedSequences(td.train, 32, seed=0), cfg, tmp_path / f"run{w}").train()
        with torch.no_grad():
            after[w] = float(kl_to_teacher(model(input_ids=ids).logits, backbone))
    assert after[1.0] < before and after[1.0] < 0.9 * after[0.0], (before, after)


def test_distill_outside_0_1_is_refused():
    with pytest.raises(ValueError, match=r"--distill 1.5: allowed: 0..1"):
        train_mod.TrainConfig(distill=1.5).validate()


def test_attention_transfer_matches_each_layer_to_the_frozen_one_then_hands_over(tmp_path):
    """--transfer-steps N: the first N steps' loss is the mean normalised error of each layer's attention output
    against the frozen layer's on the backbone's stream (which the logits then equal); training on it lowers that
    error; the steps after it train on cross-entropy (the logged loss changes scale)."""
    from golinear.models.training.distill import attention_transfer
    model, tok, ids, backbone = linearized(lora=True)
    with torch.no_grad(), attention_transfer(model) as errors:
        logits = model(input_ids=ids).logits
    torch.testing.assert_close(logits, backbone, atol=2e-5, rtol=2e-5)  # the stream is the backbone's
    assert len(errors) == 2 and all(0 < float(e) for e in errors)
    before = float(training_loss(model, ids, transfer=True))
    assert before == pytest.approx(float(torch.stack(errors).mean()), rel=1e-5)
    td = data_mod.prepare_books(tok, write_books(tmp_path / "data"), heldout_docs=2)
    cfg = train_mod.TrainConfig(seq_len=32, batch_size=2, steps=30, lr=1e-2, save_every=10**6, log_every=1,
                                eval_sequences=2, transfer_steps=20)  # then 10 steps of cross-entropy
    train_mod.Trainer(model, data_mod.PackedSequences(td.train, 32, seed=0), cfg, tmp_path / "run").train()
    with torch.no_grad():
        assert float(training_loss(model, ids, transfer=True)) < 0.9 * before
    from golinear.models.training import train_utils
    log = train_utils.read_log(tmp_path / "run" / train_mod.LOG_FILE)
    assert max(r["loss"] for r in log if r["step"] <= 20) < 2 < min(r["loss"] for r in log if r["step"] > 20)
    with pytest.raises(ValueError, match=r"--transfer-steps 30: allowed: 0..29"):
        train_mod.TrainConfig(steps=30, transfer_steps=30).validate()
