#pragma once
// Muon's orthogonalization under optfuse.torch: the opaque op "newton_schulz"
// (include/optfuse/optim.h) run by the ATen ops torch.optim.Muon runs.
#include "optfuse/engine.h"

namespace optfuse::python {

// Registers it on `engine` (CPU tensors), before any Muon optimizer is created there.
void register_torch_newton_schulz(Engine& engine);

}  // namespace optfuse::python
