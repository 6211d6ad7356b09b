#pragma once
// The kernel the 16-bit conversion tests run (test_bf16, test_f16c): param (16-bit) <- the
// conversion of x (f32), x <- f32(param), both directions in one in-place call.
#include "optfuse/graph.h"

namespace optfuse::testing {

inline Graph round_trip(DType sixteen) {
  Graph gr(std::string(dtype_name(sixteen)) + "_round_trip");
  Value p = gr.param("param", sixteen);
  Value x = gr.state("x", DType::F32);
  gr.output("param", cast(x, sixteen));
  gr.output("x", cast(p, DType::F32));
  return gr;
}

}  // namespace optfuse::testing
