"""my_attention: scaled dot-product attention as a plain torch composite."""

from my_attention.attention import attention

__all__ = ["attention"]
