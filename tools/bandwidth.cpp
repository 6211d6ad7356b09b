#include "tools/bandwidth.h"

namespace optfuse::tools {

Graph stream_4r3w_graph() {
  Graph gr("stream_4r3w");
  Value p = gr.param("param"), g = gr.grad("grad");
  Value m = gr.state("exp_avg"), v = gr.state("exp_avg_sq");
  gr.output("param", p + g);
  gr.output("exp_avg", m + g);
  gr.output("exp_avg_sq", v + g);
  return gr;
}

}  // namespace optfuse::tools
