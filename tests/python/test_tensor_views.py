"""tensorxfer._tensor.as_view: the one conversion of user objects into native views."""

import numpy as np
import pytest

import tensorxfer
from tensorxfer._tensor import as_view


def test_numpy_array_view_reports_layout():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = as_view(array, "array")
    assert view.shape == (3, 4)
    assert view.strides == (4, 1)
    assert view.dtype == "float32"
    assert view.nbytes == 48
    assert view.device == "cpu:0"
    assert view.data_ptr == array.ctypes.data
    assert view.owner is array


def test_non_contiguous_input_is_refused_with_its_layout():
    array = np.zeros((3, 4), dtype=np.float64).T
    with pytest.raises(ValueError, match=r"weights must be C-contiguous, got shape=\(4, 3\) strides=\(1, 4\)"):
        as_view(array, "weights")
    assert as_view(array, "weights", contiguous=False).strides == (1, 4)


def test_read_only_buffer_is_refused_when_writing():
    array = np.zeros(8, dtype=np.uint8)
    array.setflags(write=False)
    assert as_view(array, "src").readonly
    with pytest.raises(ValueError, match="dst must be writable"):
        as_view(array, "dst", writable=True)
    with pytest.raises(ValueError, match="dst must be writable"):
        as_view(bytes(8), "dst", writable=True)


def test_unsupported_objects_raise_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="slots: expected a numpy array"):
        as_view([1, 2, 3], "slots")


@pytest.mark.parametrize(
    "dtype", ["bool", "uint8", "int16", "int32", "int64", "float16", "float32", "float64", "complex64"]
)
def test_numpy_dtypes_round_trip_by_name(dtype):
    assert as_view(np.zeros(2, dtype=dtype), "x").dtype == dtype


def test_torch_tensors_are_viewed_through_dlpack():
    torch = pytest.importorskip("torch")
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).requires_grad_(False)
    view = as_view(tensor, "tensor")
    assert (view.shape, view.strides, view.dtype, view.device) == ((2, 3), (3, 1), "bfloat16", "cpu:0")
    assert view.data_ptr == tensor.data_ptr()
    grad_tensor = torch.ones(4, requires_grad=True)
    assert as_view(grad_tensor, "g").data_ptr == grad_tensor.data_ptr()
    transposed = tensor.t()
    with pytest.raises(ValueError, match=r"tensor must be C-contiguous, got shape=\(3, 2\) strides=\(1, 3\)"):
        as_view(transposed, "tensor")


def test_package_exports_error_classes():
    assert issubclass(tensorxfer.CorruptSegmentError, ValueError)
    assert issubclass(tensorxfer.PeerLostError, tensorxfer.TensorxferError)
    assert tensorxfer.PeerLost is tensorxfer.PeerLostError  # the first name stays an alias
    assert tensorxfer.PeerLostError.__name__ == "PeerLostError"
    assert tensorxfer.capabilities()["version"] == tensorxfer.__version__
