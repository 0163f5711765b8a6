"""legalpt: domain-adaptive pre-training for legal documents.

Importing legalpt is cheap: it loads no CUDA code and does not import transformers. The attention API lives in
`legalpt.attention`; `import legalpt.hf` registers `attn_implementation="legalpt"` with transformers.
"""

__version__ = "0.1.0"
