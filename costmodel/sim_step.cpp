#include "costmodel/sim_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "profiles/units.hpp"

namespace loom::costmodel::sim {

namespace {

// One pass as the task graph indexes it: the chunk is global (the index into StepSpec::chunks).
struct Op {
  bool forward = true;
  std::int64_t micro_batch = 0;
  int chunk = 0;
};

std::string layers_text(const StageRange& r) {
  return r.first_layer == r.last_layer
             ? "L" + std::to_string(r.first_layer)
             : "L" + std::to_string(r.first_layer) + "-" + std::to_string(r.last_layer);
}

// Adds the tasks of one step to `engine` (pipeline rank r is engine rank r).

// Adds the tasks of one step to `engine` (pipeline rank r is engine rank r).
class StepBuilder {
 public:
  StepBuilder(const StepSpec& spec, Engine& engine, Comms* comms, bool names)
      : spec_(spec), engine_(engine), comms_(comms), names_(names) {}

  void build() {
    const int chunks = static_cast<int>(spec_.chunks.size());
    const std::size_t ops =
        2 * static_cast<std::size_t>(spec_.micro_batches) * static_cast<std::size_t>(chunks);
    op_tasks_.assign(ops, OpTasks{});
    for (int r = 0; r < spec_.pp; ++r) build_rank(r);
    // Inputs: a chunk's forward needs the previous chunk's output, a backward the next chunk's
    // gradient.
    for (std::int64_t mb = 0; mb < spec_.micro_batches; ++mb) {
      for (int c = 0; c < chunks; ++c) {
        if (c > 0) connect(at(true, mb, c - 1), at(true, mb, c));
        if (c + 1 < chunks) connect(at(false, mb, c + 1), at(false, mb, c));
      }
    }
  }

 private:
  struct OpTasks {
    int first = -1;    // the first task that needs the op's input
    int recv = -1;     // the receiving group's all-gather of the input
    int receive = -1;  // CPU ranks: the receiver's cores taking the transfer in
    int send = -1;     // the transfer of the op's output
    int done = -1;     // the op's last task on its rank
  };

  OpTasks& at(bool forward, std::int64_t mb, int chunk) {
    std::size_t i =
        (static_cast<std::size_t>(forward ? 0 : 1) * static_cast<std::size_t>(spec_.micro_batches) +
         static_cast<std::size_t>(mb)) *
            spec_.chunks.size() +
        static_cast<std::size_t>(chunk);
    return op_tasks_[i];
  }

  void connect(const OpTasks& producer, const OpTasks& consumer) {
    int from = producer.send >= 0 ? producer.send : producer.done;
    // The receiver's share of a transfer starts with it, when the producer's pass is done.
    if (consumer.receive >= 0) engine_.depend(producer.done, consumer.receive);
    if (consumer.recv >= 0) {
      engine_.depend(from, consumer.recv);
      engine_.depend(consumer.recv, consumer.first);
    } else {
      engine_.depend(from, consumer.first);
    }
  }

  int compute(int rank, Phase phase, double duration_s, bool pipeline, std::string name) {
    Task t;
    t.rank = rank;
    t.stream = Stream::kCompute;
    t.phase = phase;
    t.duration_s = duration_s;
    t.pipeline = pipeline;
    if (names_) t.name = std::move(name);
    return engine_.add(std::move(t));
  }

  int flow(int rank, Stream stream, Phase phase, const FlowSpec& f, std::string name,
           int peer = -1) {
    if (f.empty()) return -1;
    Task t;
    t.rank = rank;
    t.stream = stream;
    t.phase = phase;
    t.queue = spec_.cpu && (stream == Stream::kDataParallel || stream == Stream::kZero)
                  ? Stream::kCompute
                  : stream;
    t.flow = f;
    t.peer_rank = peer;
    if (names_) t.name = std::move(name);
    return engine_.add(std::move(t));
  }

  // `before` -> `task` when both exist; returns the later of the two for chaining.
  int chain(int before, int task) {
    if (task < 0) return before;
    engine_.depend(before, task);
    return task;
  }

  // ZeRO-3 before a pass of chunk c: its first block's all-gather, which the pass waits for, and
  // the other blocks' gathers on the zero stream beside the pass (each in flight while the block
  // before it computes); the passes' gathers move forward_gather_bytes and backward_gather_bytes,
  // the forward pass's after the lookup mask's all-reduce. Returns the task the pass follows.
  int block_gathers(int r, const ChunkSpec& c, Phase pass, const std::string& what, int prev) {
    const double blocks = std::max(1, c.range.last_layer - c.range.first_layer + 1);
    const bool backward = pass == Phase::kBackward;
    const double bytes = backward ? c.backward_gather_bytes : c.forward_gather_bytes;
    const double first = bytes / blocks;
    if (!backward && c.lookup_mask_bytes > 0) {
      prev = chain(prev, flow(r, Stream::kZero, pass,
                              comms_->collective(Collective::kAllReduce, Group::kData, r,
                                                 c.lookup_mask_bytes),
                              "all-reduce lookup rows " + what));
    }
    const int head = flow(r, Stream::kZero, pass,
                          comms_->collective(Collective::kAllGather, Group::kData, r, first),
                          "all-gather zero block " + what + " " + profiles::bytes_text(first));
    engine_.depend(prev, head);
    if (bytes > first) {
      const double rest = bytes - first;
      const int others = flow(r, Stream::kZero, pass,
                              comms_->collective(Collective::kAllGather, Group::kData, r, rest),
                              "all-gather zero blocks " + what + " " + profiles::bytes_text(rest));
      engine_.depend(head >= 0 ? head : prev, others);
    }
    return head >= 0 ? head : prev;
  }

  void build_rank(int r) {
    const int chunks = static_cast<int>(spec_.chunks.size());
    int prev = -1;  // the previous op's last task: the compute stream waits for it
    if (comms_ && spec_.dp > 1 && spec_.zero.gathers_before_forward &&
        !spec_.zero.gathers_per_block) {
      // ZeRO-3: the stage's parameters are gathered before the step's first forward pass.
      const double bytes = spec_.post_all_gather_bytes[static_cast<std::size_t>(r)];
      prev = flow(r, Stream::kZero, Phase::kOther,
                  comms_->collective(Collective::kAllGather, Group::kData, r, bytes),
                  "all-gather zero params " + profiles::bytes_text(bytes));
    }
    const double zero_grad_s =
        spec_.zero_grad_s.empty() ? 0 : spec_.zero_grad_s[static_cast<std::size_t>(r)];
    if (zero_grad_s > 0) {
      const int zeroing = compute(r, Phase::kOther, zero_grad_s, false, "zero gradients");
      engine_.depend(prev, zeroing);
      prev = zeroing;
    }
    for (const PipelineOp& step_op :
         pipeline_order(spec_.schedule, spec_.pp, r, spec_.micro_batches, spec_.virtual_stages)) {
      const Op op{step_op.pass == PassKind::kForward, step_op.micro_batch,
                  global_chunk(step_op.chunk, spec_.pp, r)};
      const ChunkSpec& c = spec_.chunks[static_cast<std::size_t>(op.chunk)];
      OpTasks& ot = at(op.forward, op.micro_batch, op.chunk);
      const std::string mb = "mb" + std::to_string(op.micro_batch);
      const std::string what = (op.forward ? "F " : "B ") + mb + " " + layers_text(c.range);
      const Phase pass = op.forward ? Phase::kForward : Phase::kBackward;
      const bool has_input = op.forward ? op.chunk > 0 : op.chunk + 1 < chunks;
      if (has_input && comms_ && spec_.p2p_all_gather_bytes > 0) {
        ot.recv = flow(r, Stream::kPipeline, Phase::kPipelineWait,
                       comms_->collective(Collective::kAllGather, Group::kTensor, r,
                                          spec_.p2p_all_gather_bytes),
                       "all-gather " + std::string(op.forward ? "act " : "grad ") + mb);
      }
      if (has_input && comms_ && spec_.p2p_receive_s > 0) {
        ot.receive = compute(r, Phase::kPipelineWait, spec_.p2p_receive_s, false,
                             std::string(op.forward ? "receive act " : "receive grad ") + mb);
        prev = chain(prev, ot.receive);
      }
      if (comms_ && spec_.dp > 1 && spec_.zero.gathers_per_block && c.gradient_bytes > 0) {
        prev = block_gathers(r, c, pass, what, prev);
      }
      int last = -1;
      if (!op.forward && comms_ && spec_.dp > 1 && c.gradient_bytes > 0 &&
          (spec_.zero.reduces_every_micro_batch || op.micro_batch == spec_.micro_batches - 1)) {
        last = bucketed_backward(r, c, what, prev, ot);
      } else {
        int t = compute(r, pass, op.forward ? c.forward_s : c.backward_s, true, what);
        engine_.depend(prev, t);
        ot.first = t;
        last = t;
      }
      if (op.forward) {
        engine_.task(ot.first).allocate_bytes = c.activation_bytes;
      } else {
        engine_.task(last).free_bytes = c.activation_bytes;
      }
      const TpSpec& tp = op.forward ? c.tp_forward : c.tp_backward;
      last = chain(last, flow(r, Stream::kTensorParallel, pass, tp.flow,
                              std::string(tp.kind) + " tp " + what + " (" +
                                  std::to_string(static_cast<long long>(tp.count)) + "x " +
                                  profiles::bytes_text(tp.bytes) + ")"));
      const int next_chunk = op.forward ? op.chunk + 1 : op.chunk - 1;
      if (comms_ && next_chunk >= 0 && next_chunk < chunks) {
        const int to = next_chunk % spec_.pp;
        ot.send = flow(
            r, Stream::kPipeline, Phase::kPipelineWait, comms_->p2p(r, to, spec_.p2p_bytes),
            std::string(op.forward ? "send act " : "send grad ") + mb, to * spec_.ranks_per_stage);
        last = chain(last, ot.send);
      }
      ot.done = last;
      prev = last;
    }
    // The optimizer step after every gradient reduction, then ZeRO-1/2's parameter all-gather.
    int opt = -1;
    const double opt_s =
        spec_.optimizer_s.empty() ? 0 : spec_.optimizer_s[static_cast<std::size_t>(r)];
    if (opt_s > 0) {
      opt = compute(r, Phase::kOptimizer, opt_s, false, "optimizer step");
      engine_.task(opt).optimizer = true;
      engine_.depend(prev, opt);
      engine_.depend(engine_.last_on(r, Stream::kDataParallel), opt);
    }
    int gather = -1;
    if (comms_ && spec_.zero.gathers_after_step) {
      double bytes = spec_.post_all_gather_bytes[static_cast<std::size_t>(r)];
      gather = flow(r, Stream::kZero, Phase::kOptimizer,
                    comms_->collective(Collective::kAllGather, Group::kData, r, bytes),
                    "all-gather zero params " + profiles::bytes_text(bytes));
      engine_.depend(opt >= 0 ? opt : prev, gather);
    }
    // The rank's step ends when every one of its streams is done, then sums the step's scalars.
    int lasts[kStreamCount];
    for (int s = 0; s < kStreamCount; ++s) lasts[s] = engine_.last_on(r, static_cast<Stream>(s));
    int end = compute(r, Phase::kOther, spec_.step_sync_s, false,
                      spec_.step_sync_s > 0 ? "step scalars all-reduced" : "step end");
    for (int t : lasts) engine_.depend(t, end);
    engine_.depend(prev, end);
    engine_.depend(gather, end);
  }

  // A backward pass cut where its gradients fill a bucket; each bucket is all-reduced on the dp
  // stream as soon as it is full.
  int bucketed_backward(int r, const ChunkSpec& c, const std::string& what, int prev, OpTasks& ot) {
    const double total = c.gradient_bytes;
    const auto buckets = static_cast<std::int64_t>(std::ceil(total / spec_.bucket_bytes));
    int last = prev;
    for (std::int64_t j = 0; j < buckets; ++j) {
      double bytes =
          std::min(spec_.bucket_bytes, total - static_cast<double>(j) * spec_.bucket_bytes);
      int seg = compute(r, Phase::kBackward, c.backward_s * bytes / total, true, what);
      engine_.depend(last, seg);
      if (j == 0) ot.first = seg;
      // ZeRO-2/3's executor reduces each micro-batch's buckets inside its backward pass.
      int bucket = flow(r, Stream::kDataParallel,
                        spec_.zero.reduces_every_micro_batch ? Phase::kBackward : Phase::kGradients,
                        comms_->collective(Collective::kAllReduce, Group::kData, r, bytes),
                        "allreduce dp " + profiles::bytes_text(bytes));
      engine_.depend(seg, bucket);
      last = seg;
    }
    return last;
  }

  const StepSpec& spec_;
  Engine& engine_;
  Comms* comms_;
  bool names_;
  std::vector<OpTasks> op_tasks_;
};

}  // namespace

void build_step(const StepSpec& spec, Engine& engine, Comms* comms, bool names) {
  StepBuilder(spec, engine, comms, names).build();
}

double pipeline_bubble(Engine& engine, int pp) {
  double ideal = 0;
  double pipeline = 0;
  for (int r = 0; r < pp; ++r) {
    ideal = std::max(ideal, engine.rank(r).pipeline_busy_s);
    pipeline = std::max(pipeline, engine.rank(r).pipeline_end_s);
  }
  return ideal > 0 ? pipeline / ideal - 1 : 0;
}

double replay_bubble(const StepSpec& spec) {
  StepSpec bare;
  bare.pp = spec.pp;
  bare.virtual_stages = spec.virtual_stages;
  bare.micro_batches = spec.micro_batches;
  bare.schedule = spec.schedule;
  for (const ChunkSpec& c : spec.chunks) {
    ChunkSpec k;
    k.range = c.range;
    k.forward_s = c.forward_s;
    k.backward_s = c.backward_s;
    bare.chunks.push_back(k);
  }
  Engine engine(bare.pp, nullptr);
  build_step(bare, engine, nullptr, false);
  engine.run();
  return pipeline_bubble(engine, bare.pp);
}

}  // namespace loom::costmodel::sim
