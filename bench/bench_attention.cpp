// The cost model's fused-attention time (costmodel::fused_attention_time_s) against the kernels
// bench/gpu_layers.py measured: per SDPA backend and pass, the median and largest |error| at the
// model's constants (FusedAttentionFit), and with --fit each backend's constants fitted by least
// squares on relative error (bench/attention_rows.hpp) with their median |error|. The device is
// the H200 of h200-x1 in bf16 (132 SMs, the peak at its sustained clock); --efficiency sets the
// kernel's product rate for the check (default 0.893, cuDNN's fitted rate).
//
// Usage: bench_attention LAYERS.json... [--efficiency E] [--backend NAME] [--rows] [--fit]
//        (e.g. bench_attention bench/gpu-runs/h200-attention/layers-*.json --fit)
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "bench/attention_rows.hpp"
#include "costmodel/compute.hpp"
#include "profiles/cluster.hpp"
#include "profiles/loader.hpp"

using namespace loom;

namespace {

struct Options {
  std::vector<std::string> files;
  double efficiency = 0.893;
  std::string backend;
  bool rows = false;
  bool fit = false;
};

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--efficiency" && i + 1 < argc) {
      o->efficiency = std::stod(argv[++i]);
    } else if (a == "--backend" && i + 1 < argc) {
      o->backend = argv[++i];
    } else if (a == "--rows") {
      o->rows = true;
    } else if (a == "--fit") {
      o->fit = true;
    } else if (!a.empty() && a[0] == '-') {
      return false;
    } else {
      o->files.push_back(a);
    }
  }
  return !o->files.empty();
}

void print_rows(const std::vector<bench::AttentionRow>& rows, const costmodel::GemmDevice& d,
                double efficiency) {
  for (const bench::AttentionRow& r : rows) {
    for (int pass = 0; pass < 2; ++pass) {
      const double t =
          costmodel::fused_attention_time_s(bench::attention_work(r, pass == 1), d, efficiency);
      std::printf(
          "%-9s heads %-6.0f d %-4.0f s %-6.0f %s dropout %d mask %d %-8s measured %9.1f us"
          "  model %9.1f us  %+6.1f %%\n",
          r.backend.c_str(), r.heads, r.head_dim, r.seq, r.causal ? "causal" : "full  ",
          r.dropout ? 1 : 0, r.mask ? 1 : 0, pass ? "backward" : "forward", r.time_s[pass] * 1e6,
          t * 1e6, 100 * (t / r.time_s[pass] - 1));
    }
  }
}

void print_fit(const std::string& backend, const std::vector<bench::AttentionRow>& rows,
               const costmodel::GemmDevice& d) {
  const bench::PassFit f = bench::fit_attention_pass(rows, false, d);
  const bench::PassFit b = bench::fit_attention_pass(rows, true, d);
  const costmodel::FusedAttentionFit k = bench::kernel_fit(f, b);
  std::printf(
      "%-9s rate %.3f forward, %.3f backward (backward_rate %.3f); head dimensions forward / "
      "backward: exponential %.1f / %.1f, dropout %.1f / %.1f, mask %.1f / %.1f, per block "
      "%.0f / %.0f x 128^2; setup: mask %.1f us, dropout %.1f us; median |error| %.1f %% / "
      "%.1f %%\n",
      backend.c_str(), f.efficiency, b.efficiency, k.backward_rate, k.exp_head_dims[0],
      k.exp_head_dims[1], k.dropout_head_dims[0], k.dropout_head_dims[1], k.mask_head_dims[0],
      k.mask_head_dims[1], k.block_tile_head_dims[0], k.block_tile_head_dims[1],
      k.mask_setup_s * 1e6, k.dropout_setup_s * 1e6,
      100 * bench::median_abs_error(rows, false, d, f.efficiency, k),
      100 * bench::median_abs_error(rows, true, d, f.efficiency, k));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: bench_attention LAYERS.json... [--efficiency E] [--backend NAME] "
                 "[--rows] [--fit]\n");
    return 2;
  }
  try {
    const costmodel::GemmDevice d =
        costmodel::device_rates(
            profiles::datasheet_cluster(profiles::load_cluster("h200-x1")).device,
            costmodel::Precision::kBf16, costmodel::EfficiencyDefaults{})
            .gemm;
    std::map<std::string, std::vector<bench::AttentionRow>> by_backend;
    for (const std::string& path : o.files) {
      for (const bench::AttentionRow& r : bench::read_attention_rows(path)) {
        if (o.backend.empty() || r.backend == o.backend) by_backend[r.backend].push_back(r);
      }
    }
    if (o.rows) {
      for (const auto& [backend, rows] : by_backend) print_rows(rows, d, o.efficiency);
    }
    std::printf("attention_efficiency %.3f, the model's kernel constants\n", o.efficiency);
    std::printf("backend   pass      rows  median |error|  largest |error|\n");
    for (const auto& [backend, rows] : by_backend) {
      for (int pass = 0; pass < 2; ++pass) {
        double largest = 0;
        for (const bench::AttentionRow& r : rows) {
          const double t = costmodel::fused_attention_time_s(bench::attention_work(r, pass == 1), d,
                                                             o.efficiency);
          largest = std::max(largest, std::abs(t / r.time_s[pass] - 1));
        }
        std::printf("%-9s %-8s %5zu  %13.1f %%  %14.1f %%\n", backend.c_str(),
                    pass ? "backward" : "forward", rows.size(),
                    100 * bench::median_abs_error(rows, pass == 1, d, o.efficiency), 100 * largest);
      }
    }
    if (o.fit) {
      std::printf("\nfitted per backend (least squares on relative error):\n");
      for (const auto& [backend, rows] : by_backend) print_fit(backend, rows, d);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 2;
  }
  return 0;
}
