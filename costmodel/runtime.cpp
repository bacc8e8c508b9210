#include "costmodel/runtime.hpp"

#include <algorithm>

#include "costmodel/layers.hpp"

namespace loom::costmodel {

Job executor_job(Job job) {
  job.runtime = Runtime::kLoom;
  job.half_model = false;
  job.optimizer_kernels = OptimizerKernels::kFused;
  job.reduce_precision.reset();
  job.optimizer_precision.reset();
  job.tp_comm_overlap = false;
  return job;
}

bool trains_under_autocast(const Job& job) {
  return element_bytes(job.precision) == 2 && runtime_rules(job.runtime).autocast &&
         !job.half_model;
}

KernelFusions kernel_fusions(const Job& job) {
  return job.compile ? KernelFusions::compiled() : runtime_rules(job.runtime).fusions;
}

int state_element_bytes(const Job& job) {
  return trains_under_autocast(job) ? 4 : element_bytes(job.precision);
}

LayerTime runtime_host_time(const Job& job, const Strategy& strategy, const LayerParameters& entry,
                            bool transformer_layer) {
  const auto host = runtime_rules(job.runtime).host_per_tensor;
  if (host == nullptr) return {};
  const LayerTime per_tensor = host(job, strategy);
  const auto tensors = static_cast<double>(entry.tensors);
  const bool again = transformer_layer && strategy.recompute == Recompute::kFull;
  return {per_tensor.forward_s * tensors, per_tensor.backward_s * tensors,
          again ? per_tensor.forward_s * tensors : 0};
}

double runtime_host_s_per_step(const profiles::ModelSpec& model, const Job& job,
                               const Strategy& strategy) {
  const ParameterCounts c = count_parameters(model);
  auto pass_s = [&](const LayerParameters& entry, bool layer) {
    const LayerTime t = runtime_host_time(job, strategy, entry, layer);
    return t.forward_s + t.backward_s + t.recompute_s * recompute_share(strategy, model.layers);
  };
  const double per_micro_batch =
      pass_s(c.embedding, false) +
      static_cast<double>(model.layers) * pass_s(c.transformer_layer, true) + pass_s(c.head, false);
  return per_micro_batch / strategy.pp * static_cast<double>(strategy.num_micro_batches);
}

double head_kept_bytes_per_logit(const Job& job) {
  const double e = element_bytes(job.precision);
  if (job.loss == Loss::kFused && runtime_rules(job.runtime).runs_job_loss) return e;
  return e + 4;
}

double backward_ungathered_num_parameters(const Job& job, double lookup_num_parameters) {
  return runtime_rules(job.runtime).skips_lookup_gathers ? lookup_num_parameters : 0;
}

namespace {

bool gathers_lookup_rows(const Job& job, const Strategy& s, double lookup_num_parameters) {
  return runtime_rules(job.runtime).skips_lookup_gathers && lookup_num_parameters > 0 && s.dp > 1;
}

}  // namespace

double forward_ungathered_num_parameters(const Job& job, const profiles::ModelSpec& model,
                                         const Strategy& s, double lookup_num_parameters) {
  if (!gathers_lookup_rows(job, s, lookup_num_parameters)) return 0;
  const double read = static_cast<double>(
      lookup_rows_read(model, s.tp, s.dp * s.micro_batch * job.seq_len, job.seq_len));
  return std::max(0.0, lookup_num_parameters - read);
}

double lookup_mask_bytes(const Job& job, const profiles::ModelSpec& model, const Strategy& s,
                         double lookup_num_parameters) {
  if (!gathers_lookup_rows(job, s, lookup_num_parameters)) return 0;
  return 4.0 * static_cast<double>(lookup_table_rows(model, s.tp));
}

RuntimeRules runtime_rules(Runtime runtime) {
  switch (runtime) {
    case Runtime::kLoom:
      return loom_runtime_rules();
    case Runtime::kMegatron:
      return megatron_runtime_rules();
    case Runtime::kDeepspeed:
      return deepspeed_runtime_rules();
    case Runtime::kFsdp:
      return fsdp_runtime_rules();
    case Runtime::kNemo:
      return nemo_runtime_rules();
  }
  return loom_runtime_rules();
}

std::optional<std::string> runtime_refusal(const Job& job, const Strategy& strategy) {
  const RuntimeRules rules = runtime_rules(job.runtime);
  if (job.compile && !rules.compiles) {
    return "runtime " + std::string(rules.name) +
           ": torch.compile is not available (it compiles PyTorch's Python models: use runtime "
           "fsdp or deepspeed, or compile off)";
  }
  if (job.tp_comm_overlap && !rules.overlaps_tp_communication) {
    return "runtime " + std::string(rules.name) +
           ": tp_comm_overlap is TransformerEngine's userbuffers overlap: use runtime megatron or "
           "nemo, or tp_comm_overlap off";
  }
  if (strategy.cp > 1 && !rules.context_parallel) {
    return "runtime " + std::string(rules.name) +
           ": context parallelism (cp=" + std::to_string(strategy.cp) +
           ") is Megatron-Core's with TransformerEngine's attention: use runtime megatron or nemo, "
           "or cp 1";
  }
  if (job.optimizer_kernels != OptimizerKernels::kFused && !rules.chooses_optimizer_kernels) {
    return "runtime " + std::string(rules.name) + " runs its own fused Adam: optimizer_kernels " +
           to_string(job.optimizer_kernels) + " needs runtime loom or fsdp";
  }
  if (job.reduce_precision && !rules.sets_reduce_dtype) {
    Job own = job;
    own.reduce_precision.reset();
    const double own_bytes = rules.reduce_bytes_per_parameter(own);
    if (element_bytes(*job.reduce_precision) != own_bytes) {
      return "runtime " + std::string(rules.name) + " reduces gradients in " +
             std::to_string(static_cast<int>(own_bytes)) + "-byte elements: reduce_dtype " +
             profiles::to_string(*job.reduce_precision) +
             " needs runtime fsdp, nemo or megatron (or no reduce_dtype)";
    }
  }
  if (job.optimizer_precision && *job.optimizer_precision != Precision::kFp32 &&
      !rules.sets_optimizer_dtype) {
    return "runtime " + std::string(rules.name) + " keeps fp32 optimizer states: optimizer_dtype " +
           profiles::to_string(*job.optimizer_precision) +
           " needs runtime nemo (Apex DistributedFusedAdam's dtype, zero 2)";
  }
  if (auto why = rules.refusal(job, strategy)) {
    return "runtime " + std::string(rules.name) + ": " + *why;
  }
  return std::nullopt;
}

double exposed_beyond_window_s(double comm_s, double window_s, double slowdown) {
  if (!(comm_s > 0)) return 0;
  return std::max(0.0, overlapped_time_s(window_s, comm_s, slowdown) - window_s);
}

double exposed_after_window_s(double comm_s, double window_s, double chunk_s, double slowdown) {
  if (!(comm_s > 0)) return 0;
  return std::max(exposed_beyond_window_s(comm_s, window_s, slowdown), chunk_s);
}

}  // namespace loom::costmodel
