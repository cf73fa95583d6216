// tensorxfer's own DLPack declaration (common/dlpack_abi.h) against the system
// dlpack/dlpack.h, where one is installed: every struct, field offset, enumerator and
// flag that both declare must agree, or tensors exchanged with torch/numpy would be
// misread by one of the two builds. Field by field, both at compile time and as test
// results. Without a system header there is nothing to compare and the test says so.
#include "tensorxfer/common/dlpack_abi.h"

#include <gtest/gtest.h>

#include <cstddef>

#if __has_include(<dlpack/dlpack.h>)
#include <dlpack/dlpack.h>
#define TENSORXFER_HAVE_SYSTEM_DLPACK 1
#endif

namespace {

namespace own = tensorxfer::dlpack_abi;

TEST(DlpackAbiTest, OwnDeclarationIsTheSpecificationsVersionOne) {
  EXPECT_EQ(own::kMajorVersion, 1u);
  EXPECT_EQ(own::kFlagReadOnly, 1u);
  EXPECT_EQ(own::kFlagIsCopied, 2u);
  EXPECT_EQ(own::kDLCPU, 1);
  EXPECT_EQ(own::kDLCUDAManaged, 13);
  EXPECT_EQ(own::kDLOneAPI, 14);
  EXPECT_EQ(own::kDLBool, 6);
  EXPECT_EQ(sizeof(own::DLManagedTensorVersioned),
            offsetof(own::DLManagedTensorVersioned, dl_tensor) + sizeof(own::DLTensor));
}

#ifdef TENSORXFER_HAVE_SYSTEM_DLPACK

// Same offset and same size of one field in the system's and our declaration.
#define TENSORXFER_SAME_FIELD(Struct, field)                                               \
  static_assert(offsetof(::Struct, field) == offsetof(own::Struct, field), #Struct "." #field); \
  static_assert(sizeof(::Struct::field) == sizeof(own::Struct::field), #Struct "." #field);     \
  EXPECT_EQ(offsetof(::Struct, field), offsetof(own::Struct, field)) << #Struct "." #field

#define TENSORXFER_SAME_VALUE(name) \
  EXPECT_EQ(static_cast<long long>(::name), static_cast<long long>(own::name)) << #name

TEST(DlpackAbiTest, LegacyStructsMatchTheSystemHeader) {
  static_assert(sizeof(::DLDevice) == sizeof(own::DLDevice));
  static_assert(sizeof(::DLDataType) == sizeof(own::DLDataType));
  static_assert(sizeof(::DLTensor) == sizeof(own::DLTensor));
  static_assert(sizeof(::DLManagedTensor) == sizeof(own::DLManagedTensor));
  TENSORXFER_SAME_FIELD(DLDevice, device_type);
  TENSORXFER_SAME_FIELD(DLDevice, device_id);
  TENSORXFER_SAME_FIELD(DLDataType, code);
  TENSORXFER_SAME_FIELD(DLDataType, bits);
  TENSORXFER_SAME_FIELD(DLDataType, lanes);
  TENSORXFER_SAME_FIELD(DLTensor, data);
  TENSORXFER_SAME_FIELD(DLTensor, device);
  TENSORXFER_SAME_FIELD(DLTensor, ndim);
  TENSORXFER_SAME_FIELD(DLTensor, dtype);
  TENSORXFER_SAME_FIELD(DLTensor, shape);
  TENSORXFER_SAME_FIELD(DLTensor, strides);
  TENSORXFER_SAME_FIELD(DLTensor, byte_offset);
  TENSORXFER_SAME_FIELD(DLManagedTensor, dl_tensor);
  TENSORXFER_SAME_FIELD(DLManagedTensor, manager_ctx);
  TENSORXFER_SAME_FIELD(DLManagedTensor, deleter);
}

TEST(DlpackAbiTest, EnumeratorsMatchTheSystemHeader) {
  TENSORXFER_SAME_VALUE(kDLCPU);
  TENSORXFER_SAME_VALUE(kDLCUDA);
  TENSORXFER_SAME_VALUE(kDLCUDAHost);
  TENSORXFER_SAME_VALUE(kDLOpenCL);
  TENSORXFER_SAME_VALUE(kDLVulkan);
  TENSORXFER_SAME_VALUE(kDLMetal);
  TENSORXFER_SAME_VALUE(kDLVPI);
  TENSORXFER_SAME_VALUE(kDLROCM);
  TENSORXFER_SAME_VALUE(kDLROCMHost);
  TENSORXFER_SAME_VALUE(kDLExtDev);
  TENSORXFER_SAME_VALUE(kDLCUDAManaged);
  TENSORXFER_SAME_VALUE(kDLInt);
  TENSORXFER_SAME_VALUE(kDLUInt);
  TENSORXFER_SAME_VALUE(kDLFloat);
  TENSORXFER_SAME_VALUE(kDLOpaqueHandle);
  TENSORXFER_SAME_VALUE(kDLBfloat);
  TENSORXFER_SAME_VALUE(kDLComplex);
#if defined(DLPACK_MAJOR_VERSION) || (defined(DLPACK_VERSION) && DLPACK_VERSION >= 80)
  TENSORXFER_SAME_VALUE(kDLOneAPI);
  TENSORXFER_SAME_VALUE(kDLWebGPU);
  TENSORXFER_SAME_VALUE(kDLHexagon);
  TENSORXFER_SAME_VALUE(kDLBool);
#endif
}

TEST(DlpackAbiTest, VersionedStructsMatchTheSystemHeader) {
#ifdef DLPACK_MAJOR_VERSION
  EXPECT_EQ(DLPACK_MAJOR_VERSION, own::kMajorVersion);
  EXPECT_EQ(DLPACK_FLAG_BITMASK_READ_ONLY, own::kFlagReadOnly);
  EXPECT_EQ(DLPACK_FLAG_BITMASK_IS_COPIED, own::kFlagIsCopied);
  static_assert(sizeof(::DLPackVersion) == sizeof(own::DLPackVersion));
  static_assert(sizeof(::DLManagedTensorVersioned) == sizeof(own::DLManagedTensorVersioned));
  TENSORXFER_SAME_FIELD(DLPackVersion, major);
  TENSORXFER_SAME_FIELD(DLPackVersion, minor);
  TENSORXFER_SAME_FIELD(DLManagedTensorVersioned, version);
  TENSORXFER_SAME_FIELD(DLManagedTensorVersioned, manager_ctx);
  TENSORXFER_SAME_FIELD(DLManagedTensorVersioned, deleter);
  TENSORXFER_SAME_FIELD(DLManagedTensorVersioned, flags);
  TENSORXFER_SAME_FIELD(DLManagedTensorVersioned, dl_tensor);
#else
  GTEST_SKIP() << "the system dlpack/dlpack.h (DLPACK_VERSION " << DLPACK_VERSION
               << ") predates DLPack 1.0: no versioned structs to compare";
#endif
}

#else  // no system header

TEST(DlpackAbiTest, MatchesTheSystemHeader) {
  GTEST_SKIP() << "no system dlpack/dlpack.h (Debian: libdlpack-dev) to compare against";
}

#endif

}  // namespace
