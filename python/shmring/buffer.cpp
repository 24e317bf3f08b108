// The memory of a Python object as a collective's buffer: the buffer
// protocol (numpy, bytearray, memoryview, array.array) or DLPack (torch
// tensors), with the checks that refuse what the ring cannot use as-is
// (bindings.hpp says why).

#include <cstring>
#include <optional>
#include <string>

#include "bindings.hpp"

namespace shmring::python {

// ---------------------------------------------------------------------------
// DLPack: the consumer side of the exchange, declared from the published ABI
// (a plain C struct layout shared by every framework that speaks DLPack).

enum DlDeviceType : std::int32_t { kDlCpu = 1 };
enum DlTypeCode : std::uint8_t { kDlInt = 0, kDlUInt = 1, kDlFloat = 2, kDlBfloat = 4 };

struct DlDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DlDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DlTensor {
  void* data;
  DlDevice device;
  std::int32_t ndim;
  DlDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // In elements; null means compact row-major.
  std::uint64_t byte_offset;
};
struct DlManagedTensor {
  DlTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DlManagedTensor* self);
};

// Capsule names fixed by the protocol: the producer names it "dltensor"; a
// consumer that takes ownership renames it so the capsule's own destructor
// does not free the tensor a second time.
constexpr const char* kDlCapsule = "dltensor";
constexpr const char* kDlUsedCapsule = "used_dltensor";

BufferView::~BufferView() {
  if (has_py_buffer_) PyBuffer_Release(&py_buffer_);
  if (managed_ && managed_->deleter) managed_->deleter(managed_);
}

// "ndarray", "Tensor", "bytes object": the messages read "the {} is ...",
// and "the bytes is read-only" would not.
std::string type_name(py::handle obj) {
  std::string name = py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
  if (name == "bytes" || name == "bytearray" || name == "memoryview") name += " object";
  return name;
}

// "dtype int16 " / "dtype torch.int16 ": the object's own name for its
// element type (numpy's and torch's `dtype`), which says more to a user than
// a buffer format or DLPack code; "" when it has none.
std::string dtype_words(py::handle obj) {
  try {
    if (py::hasattr(obj, "dtype"))
      return "dtype " + py::str(obj.attr("dtype")).cast<std::string>() + " ";
  } catch (py::error_already_set&) {
  }
  return "";
}

// The element type of a buffer-protocol format string ("f", "<e", "=q", ...).
std::optional<DataType> datatype_of_format(const char* format, Py_ssize_t itemsize) {
  std::string f = format ? format : "B";
  // Native or explicit little-endian only: the kernels work on native values.
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  if (f.size() != 1) return std::nullopt;
  switch (f[0]) {
    case 'f':
      return itemsize == 4 ? std::optional(DataType::float32) : std::nullopt;
    case 'd':
      return itemsize == 8 ? std::optional(DataType::float64) : std::nullopt;
    case 'e':
      return itemsize == 2 ? std::optional(DataType::float16) : std::nullopt;
    case 'B':
      return itemsize == 1 ? std::optional(DataType::uint8) : std::nullopt;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      // Signed integers: the C name's width varies by platform, the size not.
      switch (itemsize) {
        case 1:
          return DataType::int8;
        case 4:
          return DataType::int32;
        case 8:
          return DataType::int64;
      }
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<DataType> datatype_of_dlpack(const DlDataType& t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDlFloat:
      if (t.bits == 32) return DataType::float32;
      if (t.bits == 64) return DataType::float64;
      if (t.bits == 16) return DataType::float16;
      return std::nullopt;
    case kDlBfloat:
      return t.bits == 16 ? std::optional(DataType::bfloat16) : std::nullopt;
    case kDlInt:
      if (t.bits == 8) return DataType::int8;
      if (t.bits == 32) return DataType::int32;
      if (t.bits == 64) return DataType::int64;
      return std::nullopt;
    case kDlUInt:
      return t.bits == 8 ? std::optional(DataType::uint8) : std::nullopt;
  }
  return std::nullopt;
}

constexpr const char* kSupportedTypes =
    "float32, float64, float16, bfloat16, int8, uint8, int32 or int64";

void BufferView::acquire(py::handle obj, const char* what, bool writable) {
  // The buffer protocol first: it is the only one that reports read-only
  // memory (numpy refuses to export such an array through DLPack anyway).
  if (PyObject_CheckBuffer(obj.ptr())) {
    acquire_buffer(obj, what, writable);
  } else if (py::hasattr(obj, "__dlpack__")) {
    acquire_dlpack(obj, what);
  } else {
    throw InvalidArgumentError(fmt::format(
        "{}: a {} has neither the buffer protocol nor __dlpack__; expected a numpy array, a "
        "torch CPU tensor or another contiguous buffer",
        what, type_name(obj)));
  }
}

void BufferView::acquire_buffer(py::handle obj, const char* what, bool writable) {
  // Ask for strides and format without demanding contiguity or writability,
  // so that we can say which of the two is missing.
  if (PyObject_GetBuffer(obj.ptr(), &py_buffer_, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
    // The exporter refused (numpy: "cannot include dtype 'M' in a buffer"
    // for datetime64): its words, in shmring's error.
    py::error_already_set e;
    const std::string dtype_said = dtype_words(obj);
    throw InvalidArgumentError(
        fmt::format("{}: the {} {}cannot be read through the buffer protocol ({}: {}); expected {}",
                    what, type_name(obj), dtype_said.empty() ? "" : "with " + dtype_said,
                    py::str(e.type().attr("__name__")).cast<std::string>(),
                    py::str(e.value()).cast<std::string>(), kSupportedTypes));
  }
  has_py_buffer_ = true;
  const Py_buffer& b = py_buffer_;
  if (writable && b.readonly)
    throw InvalidArgumentError(
        fmt::format("{}: the {} is read-only; a collective writes its result into this buffer "
                    "(for numpy, pass a writable array, e.g. a copy)",
                    what, type_name(obj)));
  if (!PyBuffer_IsContiguous(&b, 'C'))
    throw InvalidArgumentError(
        fmt::format("{}: the {} is not C-contiguous; shmring reduces in place and never copies "
                    "(pass a contiguous array, e.g. numpy.ascontiguousarray)",
                    what, type_name(obj)));
  auto dtype = datatype_of_format(b.format, b.itemsize);
  if (!dtype) {
    // "dtype int16 (element format 'h', 2 bytes)" where the object names a
    // dtype, "elements of format 'h' (2 bytes)" where it does not
    // (array.array, memoryview).
    const std::string dtype_said = dtype_words(obj);
    const std::string size = fmt::format("{} byte{}", b.itemsize, b.itemsize == 1 ? "" : "s");
    const char* format = b.format ? b.format : "B";
    throw InvalidArgumentError(fmt::format(
        "{}: the {} has {}; expected {}", what, type_name(obj),
        dtype_said.empty() ? fmt::format("elements of format '{}' ({})", format, size)
                           : fmt::format("{}(element format '{}', {})", dtype_said, format, size),
        kSupportedTypes));
  }
  dtype_ = *dtype;
  data_ = b.buf;
  count_ = static_cast<std::size_t>(b.len / b.itemsize);
}

void BufferView::acquire_dlpack(py::handle obj, const char* what) {
  // A torch negative view (torch._neg_view, the real part of a conjugate's
  // negation) stores -x with a bit that says so; DLPack cannot carry the
  // bit, and torch 1.13 exports such a tensor anyway: its stored values
  // would be reduced (wrong for max and min, and for the caller's reading).
  if (py::hasattr(obj, "is_neg") && obj.attr("is_neg")().cast<bool>())
    throw InvalidArgumentError(
        fmt::format("{}: the {} is a negative view (its is_neg() is True), whose stored "
                    "values are the negation of what it shows; pass t.resolve_neg()",
                    what, type_name(obj)));
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    // torch refuses tensors that require grad, bool tensors, conjugate views...
    std::string why = py::str(e.value()).cast<std::string>();
    throw InvalidArgumentError(
        fmt::format("{}: the {} cannot be shared through DLPack: {}: {}", what, type_name(obj),
                    py::str(e.type().attr("__name__")).cast<std::string>(), why));
  }
  auto* managed = static_cast<DlManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kDlCapsule));
  if (managed == nullptr) throw py::error_already_set();  // Wrong or already used capsule.
  // Ownership moves to us: rename so the capsule's destructor leaves it alone.
  if (PyCapsule_SetName(capsule.ptr(), kDlUsedCapsule) != 0) throw py::error_already_set();
  managed_ = managed;

  const DlTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDlCpu)
    throw InvalidArgumentError(fmt::format(
        "{}: the {} lives on DLPack device type {} (id {}); shmring reduces CPU memory only "
        "(device type {})",
        what, type_name(obj), t.device.device_type, t.device.device_id, int{kDlCpu}));
  auto dtype = datatype_of_dlpack(t.dtype);
  if (!dtype)
    throw InvalidArgumentError(fmt::format(
        "{}: the {} has {}(DLPack code {}, bits {}, lanes {}); expected {}", what, type_name(obj),
        dtype_words(obj), t.dtype.code, t.dtype.bits, t.dtype.lanes, kSupportedTypes));
  std::size_t count = 1;
  for (std::int32_t i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0)
      throw InvalidArgumentError(
          fmt::format("{}: DLPack shape[{}] is {}, negative", what, i, t.shape[i]));
    count *= static_cast<std::size_t>(t.shape[i]);
  }
  if (t.strides != nullptr && count > 0) {
    // Row-major compact: each stride is the product of the extents after it.
    // An extent of 1 may carry any stride (torch gives such dims odd ones).
    std::int64_t expected = 1;
    for (std::int32_t i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expected)
        throw InvalidArgumentError(fmt::format(
            "{}: the {} is not contiguous (dimension {} has stride {}, expected {}); shmring "
            "reduces in place and never copies (call .contiguous() first)",
            what, type_name(obj), i, t.strides[i], expected));
      expected *= t.shape[i];
    }
  }
  dtype_ = *dtype;
  data_ = static_cast<std::byte*>(t.data) + t.byte_offset;
  count_ = count;
}

}  // namespace shmring::python
