"""A tiny Llama checkpoint made here: random weights saved as BF16 safetensors, a SentencePiece BPE tokenizer
trained on a local text, a PEFT LoRA adapter on it; and a byte-level BPE tokenizer (trained with
`tokenizers`) that the pinned converter cannot take. Needs the [convert] extra (torch, transformers,
sentencepiece, peft)."""

from __future__ import annotations

from pathlib import Path


def train_spm(text: Path, out: Path, vocab: int = 512) -> Path:
    import sentencepiece as spm

    out.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(out / "tokenizer"),
        vocab_size=vocab,
        model_type="bpe",
        character_coverage=1.0,
        byte_fallback=True,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
        minloglevel=2,
        num_threads=2,
        train_extremely_large_corpus=False,
    )
    return out / "tokenizer.model"


def make_llama(
    folder: Path,
    text: Path,
    seed: int = 0,
    vocab: int = 512,
    hidden: int = 256,
    intermediate: int = 512,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
) -> Path:
    """A LlamaForCausalLM (random weights, BF16 safetensors; 2 layers, 256 wide unless told) with a SentencePiece
    tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    train_spm(text, folder, vocab)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger than the init's: logits that are not all alike
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer", "add_bos_token": true}')
    return folder


def make_lora(base: Path, out: Path, seed: int = 1) -> Path:
    """A PEFT LoRA adapter on q_proj/v_proj with non-zero B (PEFT starts B at zero: an adapter that does
    nothing would merge into the base unchanged)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    peft = get_peft_model(
        model,
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "v_proj"],
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        ),
    )
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_" in n:
                p.normal_(0.0, 0.3)
    peft.save_pretrained(out, safe_serialization=True)
    return out


def make_bytelevel_bpe(folder: Path, text: Path, checkpoint: Path) -> Path:
    """The checkpoint's config and weights with a byte-level BPE tokenizer (tokenizer.json) of our own training:
    its pre-tokenizer hash is none the converter knows."""
    import shutil

    from tokenizers import ByteLevelBPETokenizer

    folder.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / f, folder / f)
    tok = ByteLevelBPETokenizer()
    tok.train([str(text)], vocab_size=512, min_frequency=2, special_tokens=["<s>", "</s>", "<unk>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    return folder
