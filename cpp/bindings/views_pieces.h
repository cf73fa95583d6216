// Host tensors as the persistent plans' pieces, shared by bind_resharding.cc and
// bind_stream_messages.cc. Views cross from Python as two arrays (see
// tensorxfer.resharding.persistent_plan.describe_views): `meta` rows (address,
// itemsize, ndim) and `dims` rows (size, stride in bytes), ndim of them per view.
#pragma once

#include <pybind11/numpy.h>

#include <cstdint>
#include <vector>

#include "bindings.h"
#include "tensorxfer/resharding/persistent_plan.h"

namespace tensorxfer::bindings {

using U64Array = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// The pieces of every view of one side; `side` names it in errors (InvalidArgument).
std::vector<resharding::Pieces> views_pieces(const U64Array& meta, const I64Array& dims, const char* side);

}  // namespace tensorxfer::bindings
