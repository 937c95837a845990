from .backbones import PaCaViT  # noqa: F401
