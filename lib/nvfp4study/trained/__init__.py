"""The trained stand-in: a small model in Ling's layout, trained by the project with Ling's clamp.
Its reference (what SGLang computes), corpus, trainer, the committed artifact and the served study."""

__all__ = ["artifact", "corpus", "reference", "served", "train"]
