// Row packing: gather the rows chosen by an index vector from several named
// sources (a replay store's fields) into one packed buffer, field after
// field, each field starting on a 64-byte boundary.
//
//   offset(field k) = align64(offset(k-1) + rows * row_nbytes(k-1)),
//   nbytes          = align64(end of the last field)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorxfer/common/tensor_view.h"

namespace tensorxfer::copy {

class CopyEngine;

struct PackFieldSpec {
  std::string name;
  DLDataType dtype{kDLFloat, 32, 1};
  std::vector<int64_t> row_shape;  // shape of one row; {} for a scalar per row
};

struct PackField {
  std::string name;
  DLDataType dtype;
  std::vector<int64_t> row_shape;
  std::size_t row_nbytes = 0;  // bytes of one row
  std::size_t offset = 0;      // byte offset in the packed buffer, a multiple of 64
  std::size_t nbytes = 0;      // rows * row_nbytes
};

class PackLayout {
 public:
  static constexpr std::size_t kAlignment = 64;

  // Fields are laid out in the given order. Throws InvalidArgument for no
  // fields, an empty or repeated name, rows < 0, a negative extent, or sizes
  // (row bytes, row bytes * rows, offsets) that do not fit in size_t.
  PackLayout(std::vector<PackFieldSpec> fields, int64_t rows);

  int64_t rows() const noexcept { return rows_; }
  // Bytes of the packed buffer (a multiple of 64).
  std::size_t nbytes() const noexcept { return nbytes_; }
  const std::vector<PackField>& fields() const noexcept { return fields_; }
  // The field called `name`, or nullptr.
  const PackField* find(const std::string& name) const noexcept;

 private:
  std::vector<PackField> fields_;
  int64_t rows_ = 0;
  std::size_t nbytes_ = 0;
};

struct PackSource {
  std::string name;  // the layout field it fills
  TensorView view;   // shape (N, *row_shape), the field's dtype, contiguous host
};

// For every field f and i < layout.rows():
//   dst[f.offset + i * f.row_nbytes ...] = row indices[i] of the source of f.
// Everything is checked before the first byte is written: dst (contiguous,
// host, writable, >= layout.nbytes() bytes, overlapping no source), exactly
// one source per field (missing / extra / repeated names), each source's dtype
// (TypeMismatch) and shape (InvalidArgument), indices (int32 or int64, 1-D,
// contiguous host, length rows, not overlapping dst, every value in [0, N)
// for every source). `indices` is read exactly once, into a private copy that
// is checked and then used, so another thread changing it meanwhile cannot
// make pack_rows read outside a source.
// Errors name the field. Runs on `engine`'s threads and the caller, or on the
// caller alone when `engine` is null. Not synchronized with other writers of dst.
void pack_rows(const TensorView& dst, const PackLayout& layout,
               const std::vector<PackSource>& sources, const TensorView& indices,
               CopyEngine* engine);

}  // namespace tensorxfer::copy
