#include "tensorxfer/copy/pack.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "copy_kernels.h"
#include "tensorxfer/common/check.h"
#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"

namespace tensorxfer::copy {
namespace {

constexpr std::size_t align_up(std::size_t value, std::size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) out << ',';
  out << ')';
  return out.str();
}

std::string source_name(const std::string& field) { return "sources['" + field + "']"; }

// Gathered rows are handed out to threads in ranges of about total / 16
// bytes, within these bounds: few enough that taking one is negligible, enough
// that a thread descheduled mid-range leaves the rest to the others.
constexpr std::size_t kMinRangeBytes = std::size_t{64} << 10;
constexpr std::size_t kMaxRangeBytes = std::size_t{1} << 20;
// While copying row i, the first lines of row i + kPrefetchRows are requested:
// that starts the next random row's page walk and DRAM access early, and the
// hardware prefetcher streams the rest of it (prefetching whole rows measured
// slower).
constexpr std::size_t kPrefetchRows = 2;
constexpr std::size_t kPrefetchBytes = 128;
// Packed outputs at least this large, and at least half the last-level cache,
// are written with streaming stores: they skip reading every destination line
// before overwriting it and leave the caches to the sources (measured ~1.5x
// faster than cached stores for 16 MiB of 4 KiB rows with a 32 MiB L3, see
// bench/cpp/copy_bench.cc; on an AMD EPYC VM with 2 vCPUs, 4096 rows packed
// 1.17x torch's index_select streamed against 0.98x cached). Where the output
// fits easily in the cache (an Intel Xeon with 504 MiB of L3: 16 MiB packed 6%
// faster cached), streaming would only send to DRAM what the cache could hold.
// The cache size is the kernel's (detail::last_level_cache_bytes).
constexpr std::size_t kStreamingPackBytes = std::size_t{4} << 20;

bool stream_packed_output(std::size_t nbytes) noexcept {
  return nbytes >= std::max(kStreamingPackBytes, detail::last_level_cache_bytes() / 2);
}

struct FieldPlan {
  const PackField* field;
  const char* source;  // base of the source rows
  char* out;           // where the field's rows go in dst
};

// One unit of work: rows [begin, end) of one field.
struct RowRange {
  std::size_t field;
  int64_t begin;
  int64_t end;
};

void gather_range(const FieldPlan& plan, const int64_t* indices, int64_t begin, int64_t end,
                  bool streaming) {
  const std::size_t row = plan.field->row_nbytes;
  const char* source = plan.source;
  char* out = plan.out + static_cast<std::size_t>(begin) * row;
  const int64_t prefetch_end = row >= 256 ? end - static_cast<int64_t>(kPrefetchRows) : begin;
  const std::size_t prefetch_bytes = std::min(row, kPrefetchBytes);
  for (int64_t i = begin; i < end; ++i, out += row) {
    if (i < prefetch_end) {
      const auto ahead = static_cast<std::size_t>(indices[i + static_cast<int64_t>(kPrefetchRows)]);
      detail::prefetch_bytes(source + ahead * row, prefetch_bytes);
    }
    const char* in = source + static_cast<std::size_t>(indices[i]) * row;
    if (streaming) {
      detail::streaming_copy(out, in, row);
    } else {
      detail::small_copy(out, in, row);
    }
  }
}

// Reads the caller's indices exactly once, widened to int64, into memory no
// one else can reach: the caller's array may be changed by another thread
// while the GIL is released, and what is checked must be what is used.
std::vector<int64_t> snapshot_indices(const TensorView& indices, int64_t count, bool wide) {
  std::vector<int64_t> snapshot(static_cast<std::size_t>(count));
  if (count == 0) return snapshot;  // no memcpy from / to a null pointer
  if (wide) {
    std::memcpy(snapshot.data(), indices.data, snapshot.size() * sizeof(int64_t));
  } else {
    const auto* narrow = static_cast<const int32_t*>(indices.data);
    std::copy(narrow, narrow + count, snapshot.begin());
  }
  return snapshot;
}

void check_index_range(const std::vector<int64_t>& indices, const PackLayout& layout,
                       const std::vector<int64_t>& rows_of) {
  if (indices.empty()) return;
  const auto [low, high] = std::minmax_element(indices.begin(), indices.end());
  int64_t smallest_source = std::numeric_limits<int64_t>::max();
  std::size_t smallest_field = 0;
  for (std::size_t f = 0; f < rows_of.size(); ++f) {
    if (rows_of[f] < smallest_source) {
      smallest_source = rows_of[f];
      smallest_field = f;
    }
  }
  if (*low >= 0 && *high < smallest_source) return;
  const auto bad = *low < 0 ? low : high;
  std::ostringstream message;
  message << "indices[" << (bad - indices.begin()) << "] = " << *bad << " is out of range for "
          << source_name(layout.fields()[smallest_field].name) << " with " << smallest_source
          << " rows (expected 0 <= index < " << smallest_source << "); nothing was written";
  throw InvalidArgument(message.str());
}

bool overlaps(const TensorView& a, const TensorView& b) {
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b_begin = reinterpret_cast<std::uintptr_t>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && a_begin < b_begin + b.nbytes() &&
         b_begin < a_begin + a.nbytes();
}

}  // namespace

PackLayout::PackLayout(std::vector<PackFieldSpec> fields, int64_t rows) : rows_(rows) {
  TENSORXFER_CHECK(InvalidArgument, rows >= 0, "PackLayout: rows must be >= 0, got ", rows);
  TENSORXFER_CHECK(InvalidArgument, !fields.empty(), "PackLayout: expected at least one field, got none");
  std::unordered_set<std::string> names;
  std::size_t offset = 0;
  for (auto& spec : fields) {
    TENSORXFER_CHECK(InvalidArgument, !spec.name.empty(), "PackLayout: field names must not be empty");
    TENSORXFER_CHECK(InvalidArgument, names.insert(spec.name).second,
                     "PackLayout: field '", spec.name, "' appears twice");
    const std::string what = "PackLayout: field '" + spec.name + "'";
    for (int64_t extent : spec.row_shape) {
      TENSORXFER_CHECK(InvalidArgument, extent >= 0, what,
                       " has a negative extent in its row shape ", shape_text(spec.row_shape));
    }
    TensorView row;
    row.dtype = spec.dtype;
    const auto row_numel = static_cast<std::size_t>(checked_numel(spec.row_shape, (what + " row shape").c_str()));
    PackField field;
    field.row_nbytes = checked_mul(row_numel, row.element_size(), (what + " row bytes").c_str());
    field.offset = checked_round_up(offset, kAlignment, (what + " offset").c_str());
    field.nbytes = checked_mul(field.row_nbytes, static_cast<std::size_t>(rows), (what + " row bytes * rows").c_str());
    offset = checked_add(field.offset, field.nbytes, (what + " end offset").c_str());
    field.name = std::move(spec.name);
    field.dtype = spec.dtype;
    field.row_shape = std::move(spec.row_shape);
    fields_.push_back(std::move(field));
  }
  nbytes_ = checked_round_up(offset, kAlignment, "PackLayout: total bytes");
}

const PackField* PackLayout::find(const std::string& name) const noexcept {
  for (const auto& field : fields_) {
    if (field.name == name) return &field;
  }
  return nullptr;
}

void pack_rows(const TensorView& dst, const PackLayout& layout,
               const std::vector<PackSource>& sources, const TensorView& indices,
               CopyEngine* engine) {
  require_contiguous_host(dst, "dst");
  require_writable(dst, "dst");
  if (dst.nbytes() < layout.nbytes()) {
    throw InvalidArgument("dst: expected at least layout.nbytes = " + std::to_string(layout.nbytes()) +
                          " bytes, got " + std::to_string(dst.nbytes()) + " bytes (" +
                          dst.describe() + ")");
  }

  // Exactly one source per field.
  const auto& fields = layout.fields();
  std::vector<const PackSource*> source_of(fields.size(), nullptr);
  for (const auto& source : sources) {
    const PackField* field = layout.find(source.name);
    TENSORXFER_CHECK(InvalidArgument, field != nullptr, "sources: '", source.name,
                     "' is not a field of the layout");
    const std::size_t f = static_cast<std::size_t>(field - fields.data());
    TENSORXFER_CHECK(InvalidArgument, source_of[f] == nullptr, "sources: '", source.name,
                     "' is given twice");
    source_of[f] = &source;
  }
  std::vector<FieldPlan> plans;
  std::vector<int64_t> rows_of;
  for (std::size_t f = 0; f < fields.size(); ++f) {
    const PackField& field = fields[f];
    TENSORXFER_CHECK(InvalidArgument, source_of[f] != nullptr, "sources: missing field '",
                     field.name, "'");
    const TensorView& view = source_of[f]->view;
    const std::string name = source_name(field.name);
    require_contiguous_host(view, name.c_str());
    TENSORXFER_CHECK(TypeMismatch, view.dtype == field.dtype, name, ": expected dtype ",
                     dtype_name(field.dtype), ", got ", dtype_name(view.dtype));
    const bool shape_ok =
        view.shape.size() == field.row_shape.size() + 1 &&
        std::equal(field.row_shape.begin(), field.row_shape.end(), view.shape.begin() + 1);
    TENSORXFER_CHECK(InvalidArgument, shape_ok, name, ": expected shape (N, *",
                     shape_text(field.row_shape), "), got ", shape_text(view.shape));
    TENSORXFER_CHECK(InvalidArgument, !overlaps(dst, view), "dst overlaps ", name);
    plans.push_back({&field, static_cast<const char*>(view.data),
                     static_cast<char*>(dst.data) + field.offset});
    rows_of.push_back(view.shape[0]);
  }

  require_contiguous_host(indices, "indices");
  constexpr DLDataType kInt64{kDLInt, 64, 1};
  constexpr DLDataType kInt32{kDLInt, 32, 1};
  const bool wide = indices.dtype == kInt64;
  TENSORXFER_CHECK(TypeMismatch, wide || indices.dtype == kInt32,
                   "indices: expected dtype int32 or int64, got ", dtype_name(indices.dtype));
  TENSORXFER_CHECK(InvalidArgument, indices.shape.size() == 1 && indices.shape[0] == layout.rows(),
                   "indices: expected shape (", layout.rows(), ",) (layout.rows), got ",
                   shape_text(indices.shape));
  TENSORXFER_CHECK(InvalidArgument, !overlaps(dst, indices),
                   "indices overlap dst: pack_rows would overwrite the indices it reads (",
                   "indices ", indices.describe(), ", dst ", dst.describe(), ")");
  const std::vector<int64_t> row_indices = snapshot_indices(indices, layout.rows(), wide);
  check_index_range(row_indices, layout, rows_of);

  // Work list: each field's rows cut into ranges of about range_bytes.
  const std::size_t range_bytes = std::clamp(layout.nbytes() / 16, kMinRangeBytes, kMaxRangeBytes);
  std::vector<RowRange> ranges;
  for (std::size_t f = 0; f < plans.size(); ++f) {
    const std::size_t row = plans[f].field->row_nbytes;
    if (row == 0) continue;
    const auto step = static_cast<int64_t>(std::max<std::size_t>(1, range_bytes / row));
    for (int64_t begin = 0; begin < layout.rows(); begin += step) {
      ranges.push_back({f, begin, std::min(layout.rows(), begin + step)});
    }
  }
  const bool streaming = stream_packed_output(layout.nbytes());
  auto run = [&](std::size_t first, std::size_t last) {
    for (std::size_t r = first; r < last; ++r) {
      const RowRange& range = ranges[r];
      gather_range(plans[range.field], row_indices.data(), range.begin, range.end, streaming);
    }
  };
  // The engine fences each thread's streaming stores once, when it is done
  // with the job: a fence per range would stall on draining every time.
  if (engine != nullptr) {
    engine->parallel_for(ranges.size(), 1, run);
  } else {
    run(0, ranges.size());
    detail::streaming_fence();
  }
}

}  // namespace tensorxfer::copy
