"""The trained stand-in: a small model in Ling's layout, trained by the project with Ling's clamp.
Its reference (what SGLang computes), corpus, tokenizer, trainer and the committed artifact."""

__all__ = ["reference"]
