"""A stand-in for nvidia-ml-py on a host whose NVIDIA driver (535, CUDA 12.2) sees one
L40S: what NVML reports inside a container on such a host. Only runs that put this
folder first on PYTHONPATH import it (never the test session itself)."""


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlSystemGetDriverVersion():
    return "535.104.05"


def nvmlSystemGetCudaDriverVersion():
    return 12020


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetName(handle):
    return b"NVIDIA L40S"
