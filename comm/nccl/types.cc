#include "comm/nccl/types.h"

#include <cstring>

#include "comm/process_group.h"

namespace dlaunch::comm::nccl {

ncclDataType_t to_nccl(DType d) {
  switch (d) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI8:
      return ncclInt8;
    case DType::kU8:
      return ncclUint8;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
  }
  DLAUNCH_CHECK(false, "unknown DType");
  return ncclFloat32;
}

ncclRedOp_t to_nccl(ReduceOp op, const std::string& what) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      break;
  }
  throw CommError(what + ": " + reduce_op_error(op));
}

std::string reduce_op_error(ReduceOp op) {
  if (op != ReduceOp::kBand && op != ReduceOp::kBor && op != ReduceOp::kBxor) {
    return {};
  }
  return "ReduceOp " + std::string(reduce_op_name(op)) +
         " is not supported by the nccl backend (NCCL has no bitwise "
         "reductions); use backend 'gloo' for bitwise ops. ";
}

std::string result_text(ncclResult_t r, const std::string& last_error) {
  std::string s;
  switch (r) {
    case ncclSuccess:
      s = "ncclSuccess";
      break;
    case ncclUnhandledCudaError:
      s = "ncclUnhandledCudaError (a CUDA call inside NCCL failed)";
      break;
    case ncclSystemError:
      s = "ncclSystemError (a system call failed: sockets, shared memory, "
          "out of memory)";
      break;
    case ncclInternalError:
      s = "ncclInternalError (an internal NCCL failure)";
      break;
    case ncclInvalidArgument:
      s = "ncclInvalidArgument (a bad argument: pointer, count, dtype or "
          "rank)";
      break;
    case ncclInvalidUsage:
      s = "ncclInvalidUsage (NCCL was used wrongly, e.g. two ranks on one "
          "GPU)";
      break;
    case ncclRemoteError:
      s = "ncclRemoteError (a peer failed, or the network between the ranks "
          "did)";
      break;
    case ncclInProgress:
      s = "ncclInProgress (the operation has not finished)";
      break;
    default:
      s = "NCCL error " + std::to_string(static_cast<int>(r));
      break;
  }
  if (!last_error.empty()) s += ": " + last_error;
  return s;
}

std::string tensor_error(const Tensor& t, int device, const std::string& name) {
  if (t.device.type != DeviceType::kCuda) {
    return name +
           " is a CPU tensor; the nccl backend needs CUDA device memory "
           "(Tensor.device = {DeviceType::kCuda, " +
           std::to_string(device) + "}); use backend 'gloo' for CPU tensors. ";
  }
  if (t.device.index != device) {
    return name + " is on cuda:" + std::to_string(t.device.index) +
           " but the group uses cuda:" + std::to_string(device) +
           " (one GPU per rank; move the tensor or name the device when "
           "creating the group). ";
  }
  if (t.data == nullptr && t.numel > 0) {
    return name + " has " + std::to_string(t.numel) +
           " elements but no data pointer. ";
  }
  return {};
}

std::string id_bytes(const ncclUniqueId& id) {
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

ncclUniqueId id_from_bytes(const std::string& bytes, const std::string& key) {
  ncclUniqueId id;
  if (bytes.size() != sizeof(id)) {
    throw CommError("the NCCL unique id at store key '" + key + "' has " +
                    std::to_string(bytes.size()) + " bytes, expected " +
                    std::to_string(sizeof(id)) +
                    " (another program or NCCL version wrote it?)");
  }
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

}  // namespace dlaunch::comm::nccl

namespace dlaunch::comm::nccl {

ncclUniqueId exchange_unique_id(store::Store& store, const std::string& key,
                                int rank, std::chrono::milliseconds timeout,
                                const std::function<ncclUniqueId()>& make) {
  if (rank == 0) {
    ncclUniqueId id = make();
    try {
      store.set(key, id_bytes(id));
    } catch (const store::StoreError& e) {
      throw CommError(
          "rank 0 cannot publish the NCCL unique id at store key '" + key +
          "': " + e.what());
    }
    return id;
  }
  try {
    store.wait({key}, timeout);
    return id_from_bytes(store.get(key), key);
  } catch (const store::StoreTimeoutError& e) {
    throw CommTimeoutError(
        "rank " + std::to_string(rank) +
        " waited for rank 0's NCCL unique id at store key '" + key + "' (" +
        e.what() + "); did rank 0 start and create the same group?");
  } catch (const store::StoreError& e) {
    throw CommError("rank " + std::to_string(rank) +
                    " cannot read the NCCL unique id at store key '" + key +
                    "': " + e.what());
  }
}

}  // namespace dlaunch::comm::nccl
