"""`sgl_kernel.utils` as SGLang's CPU engine asks for it: no programmatic dependent launch."""


def is_arch_support_pdl():
    return False


def __getattr__(name):
    raise AttributeError(name)
