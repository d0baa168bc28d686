"""model.freeze and LoRA adapters (docs/foundation.md): the adapted model starts as the base model computes,
the base never moves and never travels, only the adapters are flat, summed and sent; FFA-LoRA's aggregate
is exactly the average of the clients' products; runs are the same on 1 and 2 ranks, resumed and in packs;
a Hugging Face `transformers` model trains with LoRA."""
from __future__ import annotations

import hashlib
import sys

import pytest
import torch

from conftest import (assert_packs_train_as_one_at_a_time, build_trainer, one_two_resumed, record_client_models,
                      write_config)

RANK = 4
LORA = (f"model.lora.rank={RANK}",)
MODES = ["fedit", "ffa"]


@pytest.fixture
def config(tmp_path):
    return write_config(tmp_path / "lora.yaml")  # the small MLP run of conftest: 64 -> 64 -> 64 -> 10


def base_hash(trainer) -> str:
    """SHA-256 of the frozen parameters' bytes of the trainer's global model."""
    trainer.worker.load(trainer.global_params, trainer.global_buffers)
    digest = hashlib.sha256()
    for name, p in trainer.worker.module.named_parameters():
        if not p.requires_grad:
            digest.update(name.encode() + p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


CNN = ("model.name=simplecnn", "data.synthetic_image_size=28")


@pytest.mark.parametrize("arch,mode", [((), "fedit"), (CNN, "fedit"), (CNN, "stack")],
                         ids=["mlp", "simplecnn", "simplecnn-stack"])
def test_round_zero_outputs_are_bit_identical_to_the_base_model(tmp_path, config, arch, mode):
    outputs = {}
    for name, overrides in {"base": (), "lora": (*LORA, f"model.lora.aggregate={mode}")}.items():
        trainer = build_trainer(config, tmp_path / name, *arch, *overrides)
        try:
            model = trainer.worker.module.eval()
            x = trainer.data.test_x[:64].float()
            with torch.no_grad():
                outputs[name] = model(x)
        finally:
            trainer.close()
    assert torch.equal(outputs["lora"], outputs["base"])


@pytest.mark.parametrize("mode", MODES)
def test_only_the_adapters_are_flat_summed_and_sent(tmp_path, config, mode):
    trainer = build_trainer(config, tmp_path / "run", *LORA, f"model.lora.aggregate={mode}",
                            "system.bandwidth=uniform:50,500")
    try:
        layers = [(n, m) for n, m in trainer.worker.module.named_modules() if type(m).__name__ == "Linear"
                  and hasattr(m, "lora_A")]
        assert len(layers) == 3  # every Linear of the MLP
        factors = ("lora_A", "lora_B") if mode == "fedit" else ("lora_B",)
        assert [n.split(".lora_")[0] for n in trainer.worker.param_slices] == \
            [n for n, _ in layers for _ in factors]
        assert all(".lora_A." in n or ".lora_B." in n for n in trainer.worker.param_slices)
        d = {n: (m.in_features, m.out_features) for n, m in layers}
        count = sum(RANK * (d_in + d_out) if mode == "fedit" else RANK * d_out for d_in, d_out in d.values())
        assert trainer.worker.num_params == trainer.global_params.numel() == count
        assert {s.name: s.numel for s in trainer.algorithm.segments()} == {"delta": count, "buffers": 0}
        assert trainer.payload_bytes() == (4 * count, 4 * count)  # the adapters' float32 bytes each way
    finally:
        trainer.close()


@pytest.mark.parametrize("mode", MODES)
def test_the_frozen_base_is_bit_identical_after_training(tmp_path, config, mode):
    trainer = build_trainer(config, tmp_path / "run", *LORA, f"model.lora.aggregate={mode}",
                            "train.weight_decay=0.01", "train.momentum=0.9")
    try:
        before, start = base_hash(trainer), trainer.global_params.clone()
        for r in (1, 2):
            trainer.run_round(r)
        assert not torch.equal(trainer.global_params, start)
        assert base_hash(trainer) == before
    finally:
        trainer.close()


def test_convolutions_get_adapters_of_their_size(tmp_path, config):
    """SimpleCNN at rank r: a Conv2d(C_in, C_out, k) trains r C_in k k + C_out r numbers, a Linear r (d_in + d_out)."""
    trainer = build_trainer(config, tmp_path / "run", *CNN, *LORA)
    try:
        expected = 0
        for _, m in trainer.worker.module.named_modules():
            if hasattr(m, "lora_A"):
                base = m.base_layer
                if isinstance(base, torch.nn.Conv2d):
                    k = base.kernel_size[0] * base.kernel_size[1]
                    expected += RANK * base.in_channels * k + base.out_channels * RANK
                else:
                    expected += RANK * (base.in_features + base.out_features)
        kinds = {type(m.base_layer).__name__ for m in trainer.worker.module.modules() if hasattr(m, "lora_A")}
        assert kinds == {"Conv2d", "Linear"}
        assert trainer.worker.num_params == expected
        start = trainer.global_params.clone()
        trainer.run_round(1)
        assert not torch.equal(trainer.global_params, start)
    finally:
        trainer.close()


def products(trainer, params: torch.Tensor, frozen_a: dict) -> dict[str, torch.Tensor]:
    """Each adapted layer's B A (float64) for the flat adapter vector `params`."""
    out = {}
    for name, sl in trainer.worker.param_slices.items():
        if ".lora_B." in name:
            layer = name.split(".lora_B.")[0]
            a_name = name.replace(".lora_B.", ".lora_A.")
            a = params[trainer.worker.param_slices[a_name]] if a_name in trainer.worker.param_slices \
                else frozen_a[a_name]
            m = trainer.worker.module.get_submodule(layer)
            b = params[sl].view(m.out_features, RANK).double()
            out[layer] = b @ a.reshape(RANK, m.in_features).double()
    return out


def product_gap(tmp_path, config, mode) -> float:
    """Round 1: the largest relative gap between the aggregate's B A and the weighted average of the
    clients' B_i A_i."""
    trainer = build_trainer(config, tmp_path / mode, *LORA, f"model.lora.aggregate={mode}")
    try:
        frozen_a = {n: p.detach().clone() for n, p in trainer.worker.module.named_parameters() if ".lora_A." in n}
        seen = record_client_models(trainer)
        trainer.run_round(1)
        total = sum(w for _, w in seen)
        exact = {}
        for params, w in seen:
            for layer, prod in products(trainer, params, frozen_a).items():
                exact[layer] = exact.get(layer, 0) + prod * (w / total)
        aggregate = products(trainer, trainer.global_params, frozen_a)
        return max(((aggregate[k] - exact[k]).abs().max() / exact[k].abs().max()).item() for k in exact)
    finally:
        trainer.close()


def test_ffa_aggregate_is_the_average_of_the_products_and_fedit_is_not(tmp_path, config):
    """FFA-LoRA: A is shared and frozen, so sum w_i B_i A = (sum w_i B_i) A, exactly up to float32 rounding of
    the sum; FedIT's (sum w_i B_i)(sum w_i A_i) is not the average of the B_i A_i."""
    ffa, fedit = product_gap(tmp_path, config, "ffa"), product_gap(tmp_path, config, "fedit")
    print(f"relative gap to the average of the products after round 1: ffa {ffa:.3g}, fedit {fedit:.3g}")
    assert ffa < 1e-5
    assert fedit > 1e-2


@pytest.mark.parametrize("mode", MODES)
def test_packs_equal_one_at_a_time(tmp_path, config, mode):
    assert_packs_train_as_one_at_a_time(config, tmp_path, 3, *LORA, f"model.lora.aggregate={mode}")


@pytest.mark.parametrize("mode", [*MODES, "stack"])
def test_one_rank_equals_two_ranks_and_resumed(tmp_path, config, mode):
    one_two_resumed(config, tmp_path, *LORA, f"model.lora.aggregate={mode}")


def adapted_weights(trainer) -> list[torch.Tensor]:
    """A copy of each adapted layer's base weight (PEFT's NAME.base_layer.weight)."""
    return [m.base_layer.weight.detach().clone() for m in trainer.worker.module.modules() if hasattr(m, "lora_A")]


def test_stack_merges_exactly_the_weighted_sum_of_the_clients_products(tmp_path, config):
    """FLoRA's stacking: after round 1 each adapted base W has moved by exactly (alpha / r) sum_i w_i B_i A_i,
    recomputed here in float64 from the clients' trained factors; the adapters start again (B = 0, a new A);
    a client uploads its factors, 2 r (d_in + d_out) numbers per W, and downloads the stacked factors of the
    cohort or the dense update, whichever is fewer."""
    trainer = build_trainer(config, tmp_path / "run", *LORA, "model.lora.aggregate=stack")
    try:
        layers = [(n, m) for n, m in trainer.worker.module.named_modules() if hasattr(m, "lora_A")]
        assert [n for n in trainer.worker.param_slices] == [f"{n}.lora_{f}.default.weight" for n, _ in layers
                                                             for f in "AB"]
        dims = [(m.in_features, m.out_features) for _, m in layers]
        cohort = trainer.cfg.train.clients_per_round
        up = sum(RANK * (d_in + d_out) for d_in, d_out in dims)
        down = sum(min(cohort * RANK * (d_in + d_out), d_in * d_out) for d_in, d_out in dims)
        assert trainer.payload_bytes() == (4 * down, 4 * up)
        before, start = adapted_weights(trainer), trainer.global_params.clone()
        seen = record_client_models(trainer)
        row = trainer.run_round(1)
        assert (row["bytes_up"], row["bytes_down"]) == (cohort * 4 * up, cohort * 4 * down)
        scale = trainer.cfg.model.lora_alpha / RANK
        exact = [sum(w * prod for prod, w in ((products(trainer, params, {})[n], w) for params, w in seen))
                 for n, _ in layers]
        after = adapted_weights(trainer)
        gap = max(((a.double() - b.double() - scale * e).abs().max() / (scale * e).abs().max()).item()
                  for a, b, e in zip(after, before, exact))
        print(f"stack: largest relative gap of the merged update to the clients' sum of products {gap:.3g}")
        assert gap < 1e-5
        params = trainer.global_params
        for name, where in trainer.worker.param_slices.items():
            if ".lora_B." in name:
                assert not params[where].any()
            else:
                assert not torch.equal(params[where], start[where])  # round 2's A, a new draw
    finally:
        trainer.close()


def test_stack_packs_merge_as_one_at_a_time(tmp_path, config):
    merged = {}
    for size in (1, 3):
        trainer = build_trainer(config, tmp_path / f"pack{size}", *CNN, *LORA, "model.lora.aggregate=stack",
                                f"runtime.pack_size={size}")
        try:
            assert trainer.pack_size == size
            before = adapted_weights(trainer)
            trainer.run_round(1)
            merged[size] = adapted_weights(trainer)
            assert all(not torch.equal(a, b) for a, b in zip(merged[size], before))
        finally:
            trainer.close()
    for one, packed in zip(merged[1], merged[3]):
        torch.testing.assert_close(packed, one, rtol=1e-4, atol=1e-6)


def test_freeze_by_name_trains_only_the_rest(tmp_path, config):
    trainer = build_trainer(config, tmp_path / "run", "model.freeze=[features.*]")
    try:
        assert list(trainer.worker.param_slices) == ["head.weight", "head.bias"]
        before = base_hash(trainer)
        trainer.run_round(1)
        assert base_hash(trainer) == before
    finally:
        trainer.close()


@pytest.mark.parametrize("override,words", [
    ("model.freeze=[feature.*]", "model.freeze: 'feature.*' matches no parameter"),
    ("model.lora.targets=[nothing]", "model.lora_targets: 'nothing' matches none of the model's Linear"),
    ("model.lora.dropout=0.1", "model.lora_dropout=0.1: only 0 is supported"),
    ("model.lora.aggregate=stack aggregation.mask=gma", "model.lora_aggregate=stack sums the clients' products"),
    ("model.lora.aggregate=stack compression.up=topk", "model.lora_aggregate=stack sums the clients' products"),
    ("model.lora.aggregate=stack secagg.bits=32", "model.lora_aggregate=stack sums the clients' products"),
])
def test_bad_adapter_keys_are_refused_in_one_line(tmp_path, config, override, words):
    from distfl.errors import ConfigError

    with pytest.raises(ConfigError, match="^" + words.replace(".", r"\.").replace("*", r"\*")) as e:
        build_trainer(config, tmp_path / "run", *LORA, *override.split()).close()
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


# A plugin model around a Hugging Face BERT read from a local folder: an image's rows are its tokens.
BERT_MODEL = '''
import torch
from torch import nn
from transformers import BertModel

from distfl import Classifier

FOLDER = {folder!r}


class Rows(nn.Module):
    """An image (1 x H x W) as H tokens of width W, through BERT; the [first] token's last hidden state."""

    def __init__(self):
        super().__init__()
        self.bert = BertModel.from_pretrained(FOLDER)

    def forward(self, x):
        return self.bert(inputs_embeds=x.flatten(1, 2)).last_hidden_state[:, 0]


def build(input_shape, num_classes):
    return Classifier(Rows(), 8, num_classes)
'''


@pytest.fixture
def bert_lab(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "tiny-bert"
    tiny = transformers.BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=16, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    transformers.BertModel(tiny).save_pretrained(folder)
    (tmp_path / "bertlab").mkdir()
    (tmp_path / "bertlab" / "__init__.py").write_text("")
    (tmp_path / "bertlab" / "models.py").write_text(BERT_MODEL.format(folder=str(folder)))
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m == "bertlab" or m.startswith("bertlab.")]:
        del sys.modules[name]


@pytest.mark.parametrize("pack", [1, 3])
def test_a_transformers_model_trains_with_lora_on_its_attention(tmp_path, config, bert_lab, pack):
    trainer = build_trainer(config, tmp_path / "run", "model.name=bertlab.models:build", *LORA,
                            "model.lora.targets=['*.query','*.value',head]", f"runtime.pack_size={pack}")
    try:
        names = list(trainer.worker.param_slices)
        assert len(names) == 2 * (2 * 2 + 1)  # A and B of query and value in 2 layers, and of the head
        assert all(".lora_" in n for n in names)
        before, start = base_hash(trainer), trainer.global_params.clone()
        trainer.run_round(1)
        assert not torch.equal(trainer.global_params, start)
        assert torch.isfinite(trainer.global_params).all()
        assert base_hash(trainer) == before
    finally:
        trainer.close()


def test_central_dp_with_stack_clips_and_noises_the_merged_products(tmp_path, config):
    """privacy.mechanism=gaussian with stack: each client's product is clipped, the noise is on their sum, and
    the noisy sum is what the base moves by."""
    trainer = build_trainer(config, tmp_path / "run", *LORA, "model.lora.aggregate=stack", "privacy.mechanism=gaussian",
                            "privacy.noise_multiplier=1.0", "privacy.delta=1e-5", "algorithm.weighting=uniform")
    try:
        seen, noisy = record_client_models(trainer), {}
        inner = trainer.algorithm.inner.server_update

        def keep(params, buffers, reduced):
            noisy["sum"] = reduced["lora_products"].clone()
            inner(params, buffers, reduced)

        trainer.algorithm.inner.server_update = keep
        before = adapted_weights(trainer)
        trainer.run_round(1)
        moved = torch.cat([(a.double() - b.double()).reshape(-1) for a, b in zip(adapted_weights(trainer), before)])
        assert len(seen) == 5 and torch.isfinite(moved).all()
        torch.testing.assert_close(moved, noisy["sum"], rtol=0, atol=1e-6)
        clipped = sum(w * torch.cat([p.reshape(-1) for p in products(trainer, params, {}).values()]) for params, w in seen)
        assert (noisy["sum"] - 2.0 * clipped).abs().max() > 1e-3  # the noise (std 1 x clip / 5) is on the sum
    finally:
        trainer.close()


def test_central_dp_clips_and_noises_the_adapters_only(tmp_path, config):
    """privacy.mechanism=gaussian on a LoRA run: the noise is on the sum of the adapters (the flat vector),
    the base stays bit-identical."""
    trainer = build_trainer(config, tmp_path / "run", *LORA, "model.lora.aggregate=ffa", "privacy.mechanism=gaussian",
                            "privacy.noise_multiplier=1.0", "privacy.delta=1e-5", "algorithm.weighting=uniform")
    try:
        before, start = base_hash(trainer), trainer.global_params.clone()
        trainer.run_round(1)
        assert not torch.equal(trainer.global_params, start) and torch.isfinite(trainer.global_params).all()
        assert trainer.global_params.numel() == sum(RANK * m.out_features for m in trainer.worker.module.modules()
                                                    if hasattr(m, "lora_A"))
        assert base_hash(trainer) == before
    finally:
        trainer.close()


def test_init_from_a_base_models_run_starts_the_adapted_model_as_that_model(tmp_path, config):
    """model.init_from with adapters: a plain run's final model goes into each adapted layer's base
    (PEFT's NAME.base_layer), the adapters keep B = 0, so the adapted model's outputs are the plain
    model's, bit for bit; a LoRA run's own directory loads as it is."""
    from conftest import train_ok

    train_ok(config, f"output.dir={tmp_path / 'base'}", "train.rounds=2")
    outputs = {}
    for name, overrides in {"plain": (f"model.init_from={tmp_path / 'base'}",),
                            "lora": (f"model.init_from={tmp_path / 'base'}", *LORA)}.items():
        trainer = build_trainer(config, tmp_path / name, *overrides)
        try:
            x = trainer.data.test_x[:64].float()
            with torch.no_grad():
                outputs[name] = trainer.worker.module.eval()(x)
        finally:
            trainer.close()
    assert torch.equal(outputs["lora"], outputs["plain"])
    train_ok(config, f"output.dir={tmp_path / 'adapted'}", *LORA, "train.rounds=2")
    again = build_trainer(config, tmp_path / "again", f"model.init_from={tmp_path / 'adapted'}", *LORA)
    again.close()


def adapter_count(trainer, mode: str) -> int:
    """The trained adapter numbers of the MLP, from its layers' sizes: r (d_in + d_out) per Linear for fedit
    (A and B), r d_out for ffa (B only)."""
    layers = [m.base_layer for m in trainer.worker.module.modules() if hasattr(m, "lora_A")]
    return sum(RANK * (m.in_features + m.out_features) if mode == "fedit" else RANK * m.out_features for m in layers)


def lora_rounds(tmp_path, config, name: str, *overrides: str, rounds: int = 2):
    """(global adapters after `rounds` rounds, each round's row, whether the base stayed bit-identical, the
    adapters' count) of an in-process LoRA run with `overrides`."""
    trainer = build_trainer(config, tmp_path / name, *LORA, *overrides)
    try:
        before = base_hash(trainer)
        rows = [trainer.run_round(r) for r in range(1, rounds + 1)]
        mode = trainer.cfg.model.lora_aggregate
        return trainer.global_params.clone(), rows, base_hash(trainer) == before, adapter_count(trainer, mode)
    finally:
        trainer.close()


@pytest.mark.parametrize("mode", MODES)
def test_top_k_compresses_only_the_adapters(tmp_path, config, mode):
    """compression.up=topk with error feedback on a LoRA run: each client sends top-k of its adapters' update
    (bytes: the compressor's closed form for the adapters' count), the base stays bit-identical; at density 1
    the run is the uncompressed LoRA run, bit for bit."""
    from distfl.compression import TopK

    lora = (f"model.lora.aggregate={mode}",)
    plain, _, _, count = lora_rounds(tmp_path, config, "plain", *lora)
    sparse, rows, base_kept, _ = lora_rounds(tmp_path, config, "sparse", *lora, "compression.up=topk",
                                             "compression.density=0.1", "compression.error_feedback=true")
    assert base_kept and torch.isfinite(sparse).all() and not torch.equal(sparse, plain)
    per_client = (TopK(density=0.1).bits(count) + 7) // 8
    assert [(row["bytes_up"], row["bytes_down"]) for row in rows] == [(5 * per_client, 5 * 4 * count)] * 2
    assert 0 < rows[-1]["compression_vnmse"] < 1
    identity, _, base_kept, _ = lora_rounds(tmp_path, config, "identity", *lora, "compression.up=topk",
                                            "compression.density=1.0", "compression.error_feedback=true")
    assert base_kept and torch.equal(identity, plain)


def test_wide_secure_aggregation_of_the_adapters_is_the_plain_run_within_the_rounding_bound(tmp_path, config):
    """secagg.bits=56 (verified) on a LoRA fedit run: each client masks its adapters only (bytes: the
    protocol's cost for the adapters' count), the model is the plain LoRA run's within the rounding bound of
    tests/integration/test_secagg.py, the base stays bit-identical."""
    from distfl.secagg import cost

    from test_secagg import WIDE

    lora = ("model.lora.aggregate=fedit",)
    plain, _, _, count = lora_rounds(tmp_path, config, "plain", *lora, rounds=1)
    secure, (row,), base_kept, _ = lora_rounds(tmp_path, config, "secure", *lora, *WIDE, rounds=1)
    assert base_kept
    # SecAgg's complete graph: 4 neighbours each; down, the adapters and the neighbours' keys and shares
    assert (row["bytes_up"], row["bytes_down"]) == (5 * cost.upload_bytes(count, 56, 4),
                                                    5 * (4 * count + cost.download_bytes(4)))
    # 5 clients' terms: within 5 x 1.5 units of 2^-40 of the exact sum, then two float32 roundings.
    larger = torch.maximum(plain.abs(), secure.abs())
    ulp = (torch.nextafter(larger, torch.tensor(float("inf"))) - larger).double()
    assert bool(((secure.double() - plain.double()).abs() <= 5 * 1.5 * 2.0**-40 + 2 * ulp).all())
    assert row["secagg_wraps"] == 0


def test_distributed_dp_noises_the_adapters_and_records_epsilon(tmp_path, config):
    """privacy.mechanism=ddgauss on a LoRA ffa run: each client clips, rounds and noises its adapters under
    secure aggregation, the base stays bit-identical, and the round's epsilon is the accountant's for the
    adapters' count padded to a power of two (552 B numbers of the MLP: 1,024, not the full model's 16,384)."""
    import math

    from distfl.privacy.distributed_accounting import ddgauss_epsilon

    from test_secagg import DDGAUSS

    adapters, (row,), base_kept, count = lora_rounds(tmp_path, config, "run", "model.lora.aggregate=ffa", *DDGAUSS,
                                                     "privacy.noise_multiplier=0.5", rounds=1)
    assert base_kept and torch.isfinite(adapters).all() and adapters.any()
    assert count == 552
    assert row["privacy_epsilon"] == ddgauss_epsilon(scale=2.0**12, local_sigma=0.5 / math.sqrt(5), num_clients=5,
                                                     l2_clip=1.0, beta=math.exp(-0.5), dim=1024, q=1.0, steps=1,
                                                     delta=1e-5)
