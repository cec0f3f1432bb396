#pragma once

// Internal to the nccl backend: comm's types mapped to NCCL's, and NCCL's
// errors to messages. Pure functions: they need no GPU (unit-tested).

#include <nccl.h>

#include <chrono>
#include <functional>
#include <string>

#include "comm/store/store.h"
#include "comm/tensor.h"

namespace dlaunch::comm::nccl {

ncclDataType_t to_nccl(DType d);

// NCCL's op for `op`. Throws CommError naming `what` for BAND/BOR/BXOR,
// which NCCL lacks (reduce_op_error). AVG is NCCL's own ncclAvg.
ncclRedOp_t to_nccl(ReduceOp op, const std::string& what);

// "ncclRemoteError (a peer failed or the network between them did)" and,
// when non-empty, NCCL's last error text.
std::string result_text(ncclResult_t r, const std::string& last_error = {});

// Empty when `t` is CUDA memory on `device` that NCCL can use; otherwise why
// not, naming `name` and the fix (CPU tensors belong to the gloo backend).
std::string tensor_error(const Tensor& t, int device, const std::string& name);

// The unique id's bytes as stored, and back (throws CommError on a value of
// the wrong size).
std::string id_bytes(const ncclUniqueId& id);
ncclUniqueId id_from_bytes(const std::string& bytes, const std::string& key);

// The unique id every rank of a new communicator joins with: rank 0 makes
// it with `make` (ncclGetUniqueId) and sets it at `key`; the others wait for
// it at most `timeout`. Throws CommError (CommTimeoutError) naming the key
// and rank 0.
ncclUniqueId exchange_unique_id(store::Store& store, const std::string& key,
                                int rank, std::chrono::milliseconds timeout,
                                const std::function<ncclUniqueId()>& make);

// "" when `op` is one NCCL has; else why not (bitwise ops).
std::string reduce_op_error(ReduceOp op);

}  // namespace dlaunch::comm::nccl
