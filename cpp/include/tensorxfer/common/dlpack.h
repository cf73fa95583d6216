// The DLPack C ABI for tensors crossing into the core: the one include for it in
// the whole project (never include <dlpack/dlpack.h> directly).
//
// With TENSORXFER_USE_SYSTEM_DLPACK=1 (CMake sets it when the system dlpack/dlpack.h
// declares DLPack >= 1.0) this is the system header. Otherwise it is tensorxfer's own
// declaration (dlpack_abi.h), made visible under the standard global names
// (DLTensor, DLManagedTensorVersioned, kDLCPU, DLPACK_FLAG_BITMASK_READ_ONLY, ...),
// so code written against either reads the same.
#pragma once

#if defined(TENSORXFER_USE_SYSTEM_DLPACK) && TENSORXFER_USE_SYSTEM_DLPACK

#include <dlpack/dlpack.h>
#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
#error "TENSORXFER_USE_SYSTEM_DLPACK=1 needs dlpack/dlpack.h from DLPack >= 1.0"
#endif

#else  // the project's own declaration

#ifdef DLPACK_DLPACK_H_
#error "<dlpack/dlpack.h> was included before tensorxfer/common/dlpack.h: the two declare the same names"
#endif
#include "tensorxfer/common/dlpack_abi.h"

// The C header declares these in the global namespace; so do we.
using namespace tensorxfer::dlpack_abi;  // NOLINT(google-global-names-in-headers)

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0
#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)
static_assert(DLPACK_FLAG_BITMASK_READ_ONLY == tensorxfer::dlpack_abi::kFlagReadOnly &&
              DLPACK_FLAG_BITMASK_IS_COPIED == tensorxfer::dlpack_abi::kFlagIsCopied &&
              DLPACK_MAJOR_VERSION == tensorxfer::dlpack_abi::kMajorVersion &&
              DLPACK_MINOR_VERSION == tensorxfer::dlpack_abi::kMinorVersion);

#endif
