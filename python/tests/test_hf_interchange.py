"""nobubble's Llama blocks against transformers' own `LlamaForCausalLM`, both ways.

nobubble -> transformers: a model trained by `nobubble train --arch llama` and written by
`nobubble export --format hf` loads with `AutoModelForCausalLM.from_pretrained` and gives
nobubble's logits. transformers -> nobubble: a random Llama made and saved by transformers
(grouped-query attention, its own rotary base and norm epsilon) gives transformers' logits
in `nobubble score`, which reads the directory as `train --init-from` does. No downloads.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from test_plan import cli_binary  # noqa: E402

TEXT = b"In the beginning God created the heaven"


def nobubble(*args: str) -> str:
    run = subprocess.run(
        [str(cli_binary()), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, (args, run.stderr)
    return run.stdout


def nobubble_logits(model: Path, tmp: Path, *extra: str) -> tuple[np.ndarray, float]:
    out = tmp / "logits.safetensors"
    text = TEXT.decode()
    scored = nobubble("score", "--checkpoint", str(model), "--text", text, "--json",
                      "--logits", str(out), *extra)  # fmt: skip
    return safetensors_numpy.load_file(str(out))["logits"], json.loads(scored)["loss"]


def transformers_logits(model: torch.nn.Module) -> tuple[np.ndarray, float]:
    ids = torch.tensor([list(TEXT)])
    with torch.no_grad():
        out = model(ids[:, :-1])
        logits = out.logits[0]
        loss = torch.nn.functional.cross_entropy(logits.double(), ids[0, 1:])
    return logits.numpy(), loss.item()


def test_an_exported_nobubble_model_gives_the_same_logits_in_transformers(tmp_path: Path):
    run, hf = tmp_path / "run", tmp_path / "hf"
    nobubble("train", "--model", "micro", "--arch", "llama", "--layers", "3", "--heads", "4",
             "--kv-heads", "2", "--seq-len", "48", "--rope-theta", "777", "--steps", "8",
             "--lr", "1e-2", "--eval-sets", "0", "--save", str(run))  # fmt: skip
    nobubble("export", str(run), str(hf), "--format", "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_key_value_heads == 2
    theirs, their_loss = transformers_logits(model.eval())
    ours, our_loss = nobubble_logits(run, tmp_path)
    assert ours.shape == theirs.shape == (len(TEXT) - 1, 256)
    assert np.abs(ours - theirs).max() < 1e-4
    assert abs(our_loss - their_loss) < 1e-4
    # The trained model is not the initial one: the comparison is of real weights.
    assert our_loss < 5.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_transformers_llama_gives_its_logits_in_nobubble(tmp_path: Path, dtype: str):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=500.0, rms_norm_eps=1e-6,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():  # norms too: every weight away from its init
            p.add_(0.1 * torch.randn_like(p))
    model.to(getattr(torch, dtype)).save_pretrained(tmp_path / "hf")
    # transformers on the saved weights in float32 (bf16 ones widen exactly).
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "hf", dtype=torch.float32
    ).eval()
    theirs, their_loss = transformers_logits(model)
    ours, our_loss = nobubble_logits(tmp_path / "hf", tmp_path)
    assert np.abs(ours - theirs).max() < 1e-4
    assert abs(our_loss - their_loss) < 1e-4


def test_train_init_from_a_transformers_llama_starts_from_its_weights(tmp_path: Path):
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    report = tmp_path / "report.json"
    nobubble("train", "--init-from", str(tmp_path / "hf"), "--steps", "3", "-m", "2",
             "--microbatch-size", "2", "--seq-len", "64", "--eval-sets", "1",
             "--report", str(report),
             "--save", str(tmp_path / "run"))  # fmt: skip
    losses = json.loads(report.read_text())["loss"]
    # transformers' init (std 0.02) predicts bytes almost uniformly: ln 256 = 5.545.
    assert abs(losses["validation_before"] - np.log(256)) < 0.05
    # The fine-tuned model is a Llama transformers loads again.
    nobubble("export", str(tmp_path / "run"), str(tmp_path / "again"))
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again").eval()
    theirs, _ = transformers_logits(again)
    ours, _ = nobubble_logits(tmp_path / "run", tmp_path)
    assert np.abs(ours - theirs).max() < 1e-4


def test_a_model_trained_with_a_bpe_tokenizer_exports_both_for_transformers(tmp_path: Path):
    run, hf = tmp_path / "run", tmp_path / "hf"
    nobubble("train", "--model", "micro", "--arch", "llama", "--seq-len", "48",
             "--train-tokenizer", "400", "--steps", "4", "--eval-sets", "0",
             "--save", str(run))  # fmt: skip
    nobubble("export", str(run), str(hf))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(hf / "tokenizer.json"))
    assert len(tokenizer) == 400
    ids = tokenizer.encode(TEXT.decode())
    assert tokenizer.decode(ids) == TEXT.decode()
    assert len(ids) < len(TEXT), "merges learned"
    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    assert model.config.vocab_size == 400
    with torch.no_grad():
        theirs = model(torch.tensor([ids[:-1]])).logits[0].numpy()
    ours, _ = nobubble_logits(run, tmp_path)
    assert ours.shape == theirs.shape == (len(ids) - 1, 400)
    assert np.abs(ours - theirs).max() < 1e-4


def test_the_benchmarks_torch_llama_is_transformers_llama():
    """`nobubble.torch.models`' Llama blocks (the PyTorch side of bench_engine --arch llama)
    compute what transformers' LlamaForCausalLM computes on the same weights."""
    from nobubble.torch.models import GPTConfig, gpt_layers

    cfg = GPTConfig(vocab=256, hidden=64, heads=4, blocks=2, seq_len=32, arch="llama")
    ours = torch.nn.Sequential(*gpt_layers(cfg, seed=3)).eval()
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=cfg.ffn, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=cfg.kv, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=cfg.rope_theta,
    )  # fmt: skip
    theirs = transformers.LlamaForCausalLM(config).eval()
    d = cfg.hidden // cfg.heads
    with torch.no_grad():
        theirs.model.embed_tokens.weight.copy_(ours[0].tok.weight)
        for block, layer in zip(ours[1:-1], theirs.model.layers):
            q, k, v = block.qkv.weight.split([cfg.hidden, cfg.kv * d, cfg.kv * d])
            gate, up = block.gate_up.weight.chunk(2)
            pairs = [
                (layer.input_layernorm.weight, block.ln1.weight),
                (layer.self_attn.q_proj.weight, q), (layer.self_attn.k_proj.weight, k),
                (layer.self_attn.v_proj.weight, v),
                (layer.self_attn.o_proj.weight, block.proj.weight),
                (layer.post_attention_layernorm.weight, block.ln2.weight),
                (layer.mlp.gate_proj.weight, gate), (layer.mlp.up_proj.weight, up),
                (layer.mlp.down_proj.weight, block.down.weight),
            ]  # fmt: skip
            for dst, src in pairs:  # norms moved off 1, so they count
                dst.copy_(src + 0.05 * torch.randn_like(src) * (src.dim() == 1))
                src.copy_(dst)
        theirs.model.norm.weight.copy_(ours[-1].ln.weight)
        theirs.lm_head.weight.copy_(ours[-1].out.weight)
        ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
        gap = (ours(ids) - theirs(ids).logits).abs().max().item()
    assert gap < 1e-4, gap


def test_tied_embeddings_cross_both_ways(tmp_path: Path):
    # nobubble → transformers: trained with the LM head sharing the embedding.
    run, hf = tmp_path / "run", tmp_path / "hf"
    nobubble("train", "--model", "micro", "--arch", "llama", "--tie-embeddings",
             "--seq-len", "48", "--steps", "6", "--lr", "1e-2", "--eval-sets", "0",
             "--save", str(run))  # fmt: skip
    nobubble("export", str(run), str(hf))
    assert json.loads((hf / "config.json").read_text())["tie_word_embeddings"] is True
    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    theirs, _ = transformers_logits(model)
    ours, _ = nobubble_logits(run, tmp_path)
    assert np.abs(ours - theirs).max() < 1e-4
    # transformers → nobubble: a tied random Llama (no lm_head.weight in its file).
    torch.manual_seed(2)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    tied = transformers.LlamaForCausalLM(config).eval()
    tied.save_pretrained(tmp_path / "tied")
    theirs, _ = transformers_logits(tied)
    ours, _ = nobubble_logits(tmp_path / "tied", tmp_path)
    assert np.abs(ours - theirs).max() < 1e-4
