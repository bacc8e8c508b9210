// MeasuredProfile: a measured profile replaces the roofline's layer times and the formulas'
// activation bytes, and link measurements give the links' latency and bandwidth back.
#include <catch2/catch.hpp>
#include <random>

#include "costmodel/comm.hpp"
#include "costmodel/estimate.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/measured_profile.hpp"
#include "costmodel/optimizer.hpp"
#include "costmodel/simulator.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;
using profiles::LayerKind;
using profiles::LayerMeasurement;

namespace {

LayerMeasurement point(const profiles::ModelSpec& m, LayerKind kind, std::int64_t b,
                       std::int64_t seq, double fwd, double bwd, std::int64_t act) {
  LayerMeasurement p;
  p.kind = kind;
  p.hidden = m.hidden;
  p.heads = m.heads;
  p.ffn_hidden = m.ffn_hidden;
  p.seq_len = seq;
  p.micro_batch = b;
  p.forward_s = fwd;
  p.backward_s = bwd;
  p.activation_bytes = act;
  return p;
}

Strategy single(std::int64_t b, std::int64_t m) {
  Strategy s;
  s.micro_batch = b;
  s.num_micro_batches = m;
  return s;
}

}  // namespace

TEST_CASE("with a synthetic profile the estimate uses exactly its times", "[calibration]") {
  const profiles::ModelSpec model = profiles::load_model("bert-base");
  profiles::Profile prof;
  prof.device = "test";
  prof.precision = profiles::Precision::kBf16;
  prof.layers = {point(model, LayerKind::kEmbedding, 4, 128, 0.001, 0.002, 1'000'000),
                 point(model, LayerKind::kEncoderLayer, 4, 128, 0.010, 0.021, 50'000'000),
                 point(model, LayerKind::kHead, 4, 128, 0.003, 0.005, 7'000)};
  const CostModel roofline(model, profiles::load_cluster("h100-x1"));
  const CostModel cost = roofline.with_profile(std::make_shared<MeasuredProfile>(prof, model));
  const Strategy s = single(4, 2);
  const Job job{8, 128, Precision::kBf16, "adamw"};

  const SequenceCosts c = cost.sequence_costs(job, s);
  CHECK(c.layer.forward_s == 0.010);
  CHECK(c.layer.backward_s == 0.021);
  CHECK(c.embedding.forward_s == 0.001);
  CHECK(c.head.backward_s == 0.005);
  // The layer's kept bytes, less the bf16 copies of its 7,087,872 weights that autocast kept
  // beside them on the GPU (the runtime counts those apart): 50,000,000 - 14,175,744.
  constexpr double kKept = 50'000'000 - 2 * 7'087'872.0;
  CHECK(c.layer.activation_bytes == kKept);

  const Prediction p = cost.estimate(job, s, even_partition(model, 1));
  const double per_micro_batch = 0.001 + 0.002 + 12 * (0.010 + 0.021) + 0.003 + 0.005;
  CHECK(cost.step_terms(job, s).step_sync_s == 0);  // one rank: no scalar all-reduces
  CHECK(p.step_time_s == Approx(2 * per_micro_batch + p.optimizer_s).epsilon(1e-12));
  CHECK(p.memory_by_stage[0].activation_bytes == Approx(1'000'000 + 12 * kKept + 7'000));
  // Without the profile the roofline gives other figures.
  CHECK(roofline.sequence_costs(job, s).layer.forward_s != Approx(0.010));

  const std::vector<std::string> notes = cost.profile_notes(job, s);
  REQUIRE(notes.size() == 3);
  CHECK_THAT(notes[1], Catch::StartsWith("encoder layer: measured"));
}

TEST_CASE("a recomputing plan reads its embedding and head measured without recomputation",
          "[calibration]") {
  const profiles::ModelSpec model = profiles::load_model("bert-base");
  profiles::Profile prof;
  prof.device = "test";
  prof.precision = profiles::Precision::kBf16;
  LayerMeasurement layer = point(model, LayerKind::kEncoderLayer, 4, 128, 0.010, 0.031, 700'000);
  layer.recompute = "full";
  prof.layers = {point(model, LayerKind::kEmbedding, 4, 128, 0.001, 0.002, 1'000'000), layer,
                 point(model, LayerKind::kHead, 4, 128, 0.003, 0.005, 7'000)};
  const CostModel cost = CostModel(model, profiles::load_cluster("h100-x1"))
                             .with_profile(std::make_shared<MeasuredProfile>(prof, model));
  Strategy s = single(4, 2);
  s.recompute = Recompute::kFull;
  const Job job{8, 128, Precision::kBf16, "adamw"};
  const SequenceCosts c = cost.sequence_costs(job, s);
  CHECK(c.embedding.forward_s == 0.001);
  CHECK(c.embedding.backward_s == 0.002);
  CHECK(c.head.forward_s == 0.003);
  CHECK(c.layer.backward_s == 0.031);
  const std::vector<std::string> notes = cost.profile_notes(job, s);
  REQUIRE(notes.size() == 3);
  CHECK_THAT(notes[0], Catch::StartsWith("embedding: measured"));
  CHECK_THAT(notes[2], Catch::StartsWith("head: measured"));
}

TEST_CASE("times measured with the tensor-parallel all-reduces get none added", "[calibration]") {
  const profiles::ModelSpec model = profiles::load_model("bert-base");
  profiles::Profile prof;
  prof.device = "test";
  prof.precision = profiles::Precision::kBf16;
  for (const bool included : {false, true}) {
    LayerMeasurement embedding = point(model, LayerKind::kEmbedding, 4, 128, 0.001, 0.002, 1000);
    LayerMeasurement layer = point(model, LayerKind::kEncoderLayer, 4, 128, 0.010, 0.021, 5000);
    LayerMeasurement head = point(model, LayerKind::kHead, 4, 128, 0.003, 0.005, 70);
    for (LayerMeasurement* p : {&embedding, &layer, &head}) {
      p->tp = 2;
      p->tp_communication = included;
      prof.layers.push_back(*p);
    }
  }
  // Both kinds of point have the same shape: the ones with the all-reduces are preferred.
  const MeasuredProfile calibration(prof, model);
  CHECK(calibration.layer({LayerKind::kEncoderLayer, 4, 128, 2, "none", 1}).tp_communication);
  CHECK_FALSE(calibration.layer({LayerKind::kEncoderLayer, 4, 128, 1, "none", 1}).tp_communication);
  // So are they when the nearest shape is scaled (another sequence length).
  CHECK(calibration.layer({LayerKind::kEncoderLayer, 4, 256, 2, "none", 1}).tp_communication);

  const CostModel cost = CostModel(model, profiles::load_cluster("dgx-h100"))
                             .with_profile(std::make_shared<MeasuredProfile>(prof, model));
  Strategy s = single(4, 2);
  s.tp = 2;
  const Job job{8, 128, Precision::kBf16, "adamw"};
  const SequenceCosts c = cost.sequence_costs(job, s);
  CHECK(c.layer.forward_s == 0.010);
  CHECK(c.layer.backward_s == 0.021);
  CHECK(c.embedding.forward_s == 0.001);
  const Prediction p = cost.estimate(job, s, even_partition(model, 1));
  CHECK(p.exposed_communication_s.tp == 0);
  const double per_micro_batch = 0.001 + 0.002 + 12 * (0.010 + 0.021) + 0.003 + 0.005;
  // Plus the gradient norm's all-reduce over tp (a scalar) and zeroing the rank's flat gradient
  // buffer at the step's start (one fp32 write per parameter, as the optimizer's 28 bytes).
  const StepTerms terms = cost.step_terms(job, s);
  const double scalars_s = terms.step_sync_s;
  CHECK(scalars_s > 0);
  CHECK(scalars_s < 1e-4);
  const double zero_grad_s = p.optimizer_s * 4 / 28;
  CHECK(terms.zero_grad_s_per_parameter * optimizer_bytes_per_parameter(OptimizerKernels::kFused) ==
        Approx(4 * terms.optimizer_s_per_parameter));
  CHECK(p.step_time_s ==
        Approx(2 * per_micro_batch + p.optimizer_s + zero_grad_s + scalars_s).epsilon(1e-12));

  // Without the flag the same times get the links' all-reduces on top.
  for (LayerMeasurement& l : prof.layers) l.tp_communication = false;
  const CostModel plain = CostModel(model, profiles::load_cluster("dgx-h100"))
                              .with_profile(std::make_shared<MeasuredProfile>(prof, model));
  CHECK(plain.sequence_costs(job, s).layer.forward_s > 0.010);
  CHECK(plain.estimate(job, s, even_partition(model, 1)).exposed_communication_s.tp > 0);
}

TEST_CASE("micro-batches between measured ones are interpolated", "[calibration]") {
  const profiles::ModelSpec model = profiles::load_model("bert-base");
  profiles::Profile prof;
  prof.layers = {point(model, LayerKind::kEncoderLayer, 2, 128, 0.004, 0.008, 200),
                 point(model, LayerKind::kEncoderLayer, 8, 128, 0.010, 0.020, 800)};
  const MeasuredProfile cal(prof, model);
  LayerAnswer a = cal.layer({LayerKind::kEncoderLayer, 4, 128, 1, "none", 1});
  CHECK(a.how == Provenance::kInterpolated);
  CHECK(a.forward_s == Approx(0.006));
  CHECK(a.backward_s == Approx(0.012));
  CHECK(a.activation_bytes == Approx(400));
  a = cal.layer({LayerKind::kEncoderLayer, 16, 128, 1, "none", 1});  // extrapolated
  CHECK(a.forward_s == Approx(0.018));
  a = cal.layer({LayerKind::kEncoderLayer, 8, 128, 1, "none", 1});
  CHECK(a.how == Provenance::kMeasured);
  // Another sequence length: scaled from the nearest point; no head measured: roofline.
  a = cal.layer({LayerKind::kEncoderLayer, 8, 256, 1, "none", 1});
  CHECK(a.how == Provenance::kScaled);
  CHECK(a.at.seq_len == 128);
  CHECK(a.at.micro_batch == 8);
  CHECK(cal.layer({LayerKind::kHead, 8, 128, 1, "none", 1}).how == Provenance::kRoofline);
}

TEST_CASE("a scaled answer keeps the measured-to-roofline ratio", "[calibration]") {
  const profiles::ModelSpec model = profiles::load_model("bert-base");
  const CostModel roofline(model, profiles::load_cluster("h100-x1"));
  const Job job{8, 128, Precision::kBf16, "adamw"};
  const SequenceCosts r4 = roofline.sequence_costs(job, single(4, 2));
  const Job job256{8, 256, Precision::kBf16, "adamw"};
  const SequenceCosts r256 = roofline.sequence_costs(job256, single(4, 2));
  profiles::Profile prof;
  // Measured 1.5x slower forward and 2x slower backward than the roofline at s=128.
  prof.layers = {point(model, LayerKind::kEncoderLayer, 4, 128, 1.5 * r4.layer.forward_s,
                       2 * r4.layer.backward_s, 50'000'000)};
  const CostModel cost = roofline.with_profile(std::make_shared<MeasuredProfile>(prof, model));
  const SequenceCosts c = cost.sequence_costs(job256, single(4, 2));
  CHECK(c.layer.forward_s == Approx(1.5 * r256.layer.forward_s));
  CHECK(c.layer.backward_s == Approx(2 * r256.layer.backward_s));
  // The measured bytes held the layer's bf16 weight copies (2 x 7,087,872), which do not grow
  // with the sequence: the ratio scales activations and copies together, then the copies go.
  const double copies = 2 * 7'087'872.0;
  CHECK(c.layer.activation_bytes == Approx(50'000'000 * (r256.layer.activation_bytes + copies) /
                                               (r4.layer.activation_bytes + copies) -
                                           copies));
}

TEST_CASE("CPU ranks share their node's cores", "[calibration]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  const CostModel cost(model, profiles::load_cluster("local-cpu"));
  CHECK(cost.threads_per_rank(1) == 2);
  CHECK(cost.threads_per_rank(2) == 1);
  const Job job{8, 64, Precision::kFp32, "adamw"};
  Strategy one = single(8, 1);
  Strategy two = single(4, 1);
  two.dp = 2;
  // One rank on both cores runs a micro-batch of 8 as fast as one core runs a micro-batch of 4.
  CHECK(cost.sequence_costs(job, one).layer.forward_s ==
        Approx(cost.sequence_costs(job, two).layer.forward_s));
  CHECK(CostModel(model, profiles::load_cluster("h100-x1")).threads_per_rank(1) == 1);
}

TEST_CASE("link fitting recovers latency and bandwidth from noisy measurements", "[calibration]") {
  const double latency_us = 12;
  const double bandwidth_gbps = 40;
  const profiles::PathMetrics link{bandwidth_gbps, latency_us, std::nullopt};
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(1.0, 0.03);  // 3 % multiplicative noise
  std::vector<profiles::LinkMeasurement> ms;
  for (double bytes = 1024; bytes <= 64.0 * 1024 * 1024; bytes *= 4) {
    for (int ranks : {2, 4}) {
      ms.push_back({"allreduce", ranks, bytes,
                    collective_time_s(Collective::kAllReduce, bytes, ranks, link) * noise(rng),
                    "intra_node"});
      ms.push_back({"all_gather", ranks, bytes,
                    collective_time_s(Collective::kAllGather, bytes, ranks, link) * noise(rng),
                    "intra_node"});
    }
    ms.push_back({"p2p", 2, bytes, collective_time_s(Collective::kP2p, bytes, 2, link) * noise(rng),
                  "inter_node"});
  }
  const std::vector<LinkFit> fits = fit_links(ms);
  REQUIRE(fits.size() == 2);
  CHECK(fits[0].scope == "intra_node");
  CHECK(fits[0].latency_us == Approx(latency_us).epsilon(0.1));
  CHECK(fits[0].bandwidth_gbps == Approx(bandwidth_gbps).epsilon(0.05));
  CHECK(fits[0].rms_relative_error < 0.06);
  CHECK(fits[1].scope == "inter_node");
  CHECK(fits[1].bandwidth_gbps == Approx(bandwidth_gbps).epsilon(0.05));

  std::vector<std::string> notes;
  profiles::Cluster c =
      cluster_with_profile_links(profiles::load_cluster("local-cpu"), fits, &notes);
  CHECK(c.intra_node.bandwidth_gbps == fits[0].bandwidth_gbps);
  CHECK(c.intra_node.latency_us == fits[0].latency_us);
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Catch::Contains("intra-node link from the profile"));
}

TEST_CASE("CPU ranks do not hide communication behind compute", "[calibration]") {
  // The same dp=2 step on a CPU cluster and on the same cluster declared as GPUs: on the CPU the
  // gradient all-reduce is fully exposed in the estimate and in the simulation.
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Cluster cpu = profiles::load_cluster("local-cpu");
  profiles::Cluster gpu = cpu;
  gpu.device.kind = profiles::DeviceKind::kGpu;
  gpu.device.matrix_efficiency = 0.5;
  gpu.device.memory_efficiency = 0.5;
  Strategy s = single(8, 1);
  s.dp = 2;
  const Job job{16, 64, Precision::kFp32, "adamw"};
  const auto stages = even_partition(model, 1);
  CostOptions options;
  options.dp_bucket_bytes = 1 << 20;  // many buckets, so that a GPU can overlap most of them
  const CostModel on_cpu(model, cpu, options);
  const CostModel on_gpu(model, gpu, options);
  const Prediction c = on_cpu.estimate(job, s, stages);
  const Prediction g = on_gpu.estimate(job, s, stages);
  const double allreduce =
      collective_time_s(Collective::kAllReduce, 4.0 * count_parameters(model).total, 2,
                        on_cpu.group_links().group(2, 2, 1));
  CHECK(c.exposed_communication_s.dp == Approx(allreduce));
  CHECK(g.exposed_communication_s.dp < c.exposed_communication_s.dp);
  const SimulationResult sim_cpu = simulate(on_cpu, job, s, stages);
  const SimulationResult sim_gpu = simulate(on_gpu, job, s, stages);
  CHECK(sim_cpu.step_time_s > sim_gpu.step_time_s);
}

TEST_CASE("the optimizer step's working set sets the peak when activations are small",
          "[calibration]") {
  // One rank: AdamW over lists of tensors in chunks of at most twice the largest tensor (the
  // word table), with one fp32 temporary of a chunk: all of tiny-bert's parameters, fewer than
  // twice its word table; twice bert-base's word table, which holds a fifth of its parameters.
  const Job job{1, 8, Precision::kFp32, "adamw"};
  const Strategy s = single(1, 1);
  const profiles::ModelSpec tiny = profiles::load_model("tiny-bert");
  const MemoryBreakdown m = CostModel(tiny, profiles::load_cluster("local-cpu"))
                                .estimate(job, s, even_partition(tiny, 1))
                                .memory_by_stage[0];
  const double parameters = count_parameters(tiny).total;
  CHECK(parameters < 2.0 * tiny.vocab * tiny.hidden);
  CHECK(m.activation_bytes < 4 * parameters);
  CHECK(m.activation_bytes + m.buffer_bytes == Approx(4 * parameters));

  const profiles::ModelSpec base = profiles::load_model("bert-base");
  const MemoryBreakdown b = CostModel(base, profiles::load_cluster("local-cpu"))
                                .estimate(job, s, even_partition(base, 1))
                                .memory_by_stage[0];
  const double word_table = 4.0 * base.vocab * base.hidden;
  CHECK(b.activation_bytes < 2 * word_table);
  CHECK(b.activation_bytes + b.buffer_bytes == Approx(2 * word_table));
}

TEST_CASE("ZeRO-2/3 pay the gradient staging of every backward pass, all stages zero a shard",
          "[calibration]") {
  // Per parameter and backward pass: the fp32 gradient copied into the staging buffer (8 bytes)
  // and the rank's 1/dp of it summed into its shard (12 / dp); at the step's start the flat
  // buffer (ZeRO 0/1) or the shard (ZeRO-2/3) is zeroed, one fp32 write per element.
  Strategy s = single(4, 2);
  CHECK(zero_staging_bytes_per_parameter(s) == 0);
  CHECK(zeroed_gradient_parameters(s, true, 1000) == 1000);  // one CPU rank zeroes in place
  CHECK(zeroed_gradient_parameters(s, false, 1000) == 0);    // one GPU rank sets to none
  s.dp = 4;
  for (int zero : {0, 1, 2, 3}) {
    s.zero = zero;
    INFO("zero " << zero);
    CHECK(zero_staging_bytes_per_parameter(s) == (zero >= 2 ? 8 + 3 : 0));
    CHECK(zeroed_gradient_parameters(s, false, 1000) == (zero >= 2 ? 250 : 1000));
  }
  // With dp = 2, ZeRO-2's step on CPUs (no overlap) is ZeRO-1's plus the staging of two backward
  // passes, less the zeroing of half the gradients, plus what the collectives differ by.
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  const CostModel cost(model, profiles::load_cluster("local-cpu"));
  const Job job{16, 64, Precision::kFp32, "adamw"};
  s.dp = 2;
  s.zero = 1;
  const Prediction one = cost.estimate(job, s, even_partition(model, 1));
  s.zero = 2;
  const Prediction two = cost.estimate(job, s, even_partition(model, 1));
  const double parameters = count_parameters(model).total;
  const StepTerms terms = cost.step_terms(job, s);
  const double staging_s = 2 * parameters * (8 + 6) / terms.memory_bytes_per_s;
  const double zeroing_saved_s = 0.5 * parameters * terms.zero_grad_s_per_parameter;
  const double comm_s = two.exposed_communication_s.dp + two.exposed_communication_s.zero -
                        one.exposed_communication_s.dp - one.exposed_communication_s.zero;
  CHECK(two.step_time_s == Approx(one.step_time_s + staging_s - zeroing_saved_s + comm_s));
}

TEST_CASE("the word embedding's dense gradient adds to the first stage's in-flight activations",
          "[calibration]") {
  // At the end of a micro-batch's backward on pipeline rank 0, the embedding's backward holds a
  // dense fp32 gradient of the whole word table while the other micro-batches in flight keep
  // their activations: table + (in flight - 1) x A against in flight x A, so buffers =
  // table - A when that is more (A: one micro-batch's activations).
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  const CostModel cost(model, profiles::load_cluster("local-cpu"));
  const Job job{16, 64, Precision::kFp32, "adamw"};
  Strategy s = single(4, 4);
  s.pp = 2;
  s.schedule = Schedule::kGpipe;
  const double table = 4.0 * model.vocab * model.hidden;
  const StageLoad load{1e6, 1e6, 1, 1e6};
  const MemoryBreakdown first = cost.stage_memory(job, s, 0, load);
  CHECK(first.activation_bytes == Approx(4e6));
  CHECK(first.buffer_bytes == Approx(table - 1e6));
  CHECK(cost.stage_memory(job, s, 1, load).buffer_bytes == 0);  // no embedding there
  s.schedule = Schedule::k1F1B;                                 // two in flight: the same excess
  CHECK(cost.stage_memory(job, s, 0, load).buffer_bytes == Approx(table - 1e6));
  // A micro-batch whose activations outweigh the table: its backward's start stays the peak.
  const StageLoad heavy{1e6, 2 * table, 1, 1e6};
  CHECK(cost.stage_memory(job, s, 0, heavy).buffer_bytes == 0);
}

TEST_CASE("a measured optimizer step and collective factors replace the modelled ones",
          "[calibration]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile prof;
  prof.device_kind = profiles::DeviceKind::kCpu;  // threads scale a CPU's optimizer step
  // The one-rank loop's step (per tensor) and, slower, the flat one of many ranks at 1 thread.
  prof.optimizer = {{1'000'000, 1, 0.004}, {1'000'000, 2, 0.0025}, {1'000'000, 1, 0.006, true}};
  const profiles::PathMetrics link{10, 5, std::nullopt};
  // All-gathers measured at twice the ring's time, all-reduces exactly.
  for (double bytes : {65536.0, 1048576.0, 16777216.0}) {
    prof.links.push_back({"allreduce", 2, bytes,
                          collective_time_s(Collective::kAllReduce, bytes, 2, link), "intra_node"});
    prof.links.push_back({"all_gather", 2, bytes,
                          2 * collective_time_s(Collective::kAllGather, bytes, 2, link),
                          "intra_node"});
  }
  const MeasuredProfile cal(prof, model);
  CHECK(*cal.optimizer_s_per_parameter(2, false) == Approx(2.5e-9));
  CHECK(*cal.optimizer_s_per_parameter(1, false) == Approx(4e-9));
  CHECK(*cal.optimizer_s_per_parameter(4, false) == Approx(2.5e-9 * 2 / 4));  // nearest, scaled
  CHECK(*cal.optimizer_s_per_parameter(1, true) == Approx(6e-9));
  CHECK(*cal.optimizer_s_per_parameter(2, true) == Approx(6e-9 / 2));  // the loop before threads
  CHECK(cal.collective_factor(Collective::kAllGather) >
        1.5 * cal.collective_factor(Collective::kAllReduce));
  CHECK(cal.collective_factor(Collective::kP2p) == 1);  // not measured

  const CostModel cost = CostModel(model, profiles::load_cluster("local-cpu"))
                             .with_profile(std::make_shared<MeasuredProfile>(prof, model));
  const Job job{8, 64, Precision::kFp32, "adamw"};
  const Prediction p = cost.estimate(job, single(8, 1), even_partition(model, 1));
  CHECK(p.optimizer_s == Approx(count_parameters(model).total * 2.5e-9));  // 1 rank: 2 threads
  // Two ranks (one thread each) run the flat loop, each on its half (ZeRO-1).
  Strategy dp = single(4, 1);
  dp.dp = 2;
  dp.zero = 1;
  const Prediction p2 = cost.estimate(job, dp, even_partition(model, 1));
  CHECK(p2.optimizer_s == Approx(count_parameters(model).total / 2 * 6e-9));
  // The measurement is Loom's fused step: a job stepping PyTorch's eight operations is charged
  // it scaled by their bytes, 80 against 28 (a CPU has no host term).
  Job foreach = job;
  foreach
    .optimizer_kernels = OptimizerKernels::kForeach;
  CHECK(cost.estimate(foreach, single(8, 1), even_partition(model, 1)).optimizer_s ==
        Approx(count_parameters(model).total * 2.5e-9 * 80 / 28));
}

TEST_CASE("every step pays loom train's scalar all-reduces on each group of more than one",
          "[calibration]") {
  // The gradient norm over dp (ZeRO), tp and pp: one 8-byte all-reduce each; the loss and the
  // stop vote over the world (520 bytes); added after the optimizer in the estimate and in the
  // simulation.
  const profiles::ModelSpec model = profiles::load_model("bert-base");
  const CostModel cost(model, profiles::load_cluster("dgx-h100"));
  const Job job{32, 128, Precision::kBf16, "adamw"};
  const int world = 8;
  auto scalar = [&](int ranks, int stride, double bytes = 8) {
    return collective_time_s(Collective::kAllReduce, bytes, ranks,
                             cost.group_links().group(world, ranks, stride));
  };
  Strategy s = single(4, 2);
  CHECK(cost.step_terms(job, s).step_sync_s == 0);
  s.dp = 2;
  s.tp = 2;
  s.pp = 2;
  s.micro_batch = 4;
  s.num_micro_batches = 4;
  const double plain = scalar(2, 1) + scalar(2, 4) + scalar(8, 1, 520);
  CHECK(scalar(8, 1, 520) > scalar(2, 1));  // eight ranks: more latency steps than two
  CHECK(cost.step_terms(job, s).step_sync_s == Approx(plain).epsilon(1e-12));
  CHECK(plain > 0);
  const auto stages = even_partition(model, 2);
  s.zero = 1;
  CHECK(cost.step_terms(job, s).step_sync_s == Approx(plain + scalar(2, 2)).epsilon(1e-12));
  // The simulator ends every rank's step with them, after everything else of the rank.
  s.zero = 0;
  const SimulationResult sim = simulate(cost, job, s, stages);
  int found = 0;
  for (const TraceSlice& t : sim.slices) {
    if (t.name != "step scalars all-reduced") continue;
    ++found;
    CHECK(t.duration_s == Approx(plain).epsilon(1e-12));
    for (const TraceSlice& other : sim.slices) {
      if (other.rank == t.rank && &other != &t) CHECK(other.start_s < t.start_s);
    }
  }
  CHECK(found == 2);  // one per pipeline stage's representative
}

TEST_CASE("messages measured between computing ranks set p2p's factor and stay out of the fit",
          "[calibration]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  const profiles::PathMetrics link{10, 5, std::nullopt};
  profiles::Profile prof;
  for (double bytes : {65536.0, 1048576.0, 16777216.0}) {
    prof.links.push_back({"allreduce", 2, bytes,
                          collective_time_s(Collective::kAllReduce, bytes, 2, link), "intra_node"});
    prof.links.push_back(
        {"p2p", 2, bytes, collective_time_s(Collective::kP2p, bytes, 2, link), "intra_node"});
  }
  CHECK(MeasuredProfile(prof, model).collective_factor(Collective::kP2p) == Approx(1));
  // Loaded messages 3x and 5x the idle link's time: p2p's factor is their median ratio (4), and the
  // fitted link stays the idle one.
  prof.links.push_back({"p2p_loaded", 2, 65536,
                        3 * collective_time_s(Collective::kP2p, 65536, 2, link), "intra_node"});
  prof.links.push_back({"p2p_loaded", 2, 1048576,
                        5 * collective_time_s(Collective::kP2p, 1048576, 2, link), "intra_node"});
  const MeasuredProfile cal(prof, model);
  CHECK(cal.collective_factor(Collective::kP2p) == Approx(4));
  CHECK(cal.collective_factor(Collective::kAllReduce) == Approx(1));
  const std::vector<LinkFit> fits = fit_links(prof.links);
  REQUIRE(fits.size() == 1);
  CHECK(fits[0].latency_us == Approx(5).epsilon(1e-6));
  CHECK(fits[0].bandwidth_gbps == Approx(10).epsilon(1e-6));
}
