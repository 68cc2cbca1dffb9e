/*
 * bundlerun's debug runner: one BundleIO test case with every intermediate output.
 *
 * ExecuTorch's stock examples/portable/executor_runner sets no debug buffer, so its ETDump holds
 * timings only. This runner does what Qualcomm's qnn_executor_runner does for --dump_intermediate_outputs
 * (ETDumpGen + a debug buffer + EventTracerDebugLogLevel::kIntermediateOutputs), on a BundleIO program,
 * for the case named by --testset_idx (the flag of ExecuTorch's devtools example_runner). Its command
 * line mirrors qnn_executor_runner's debug flags:
 *
 *   --model_path model.bpte          the bundle (BundleIO .bpte; inputs come from its test case)
 *   --method_name NAME               default: the program's first method
 *   --testset_idx N                  the bundle's test case to run (default 0)
 *   --prefix_testset_idx A,B,...     test cases run first, in this order, on the same loaded method and
 *                                    without intermediate logging: the earlier steps of a stateful
 *                                    sequence (an LLM's KV cache lives in the method), so case N runs on
 *                                    the state they leave. The ETDump then holds one run per case; the
 *                                    last one is case N (bundlerun keeps only it)
 *   --etdump_path etdump.etdp        where the ETDump goes
 *   --dump_intermediate_outputs      log every operator output into the debug buffer
 *   --debug_output_path debug_output.bin
 *                                    where the debug buffer goes (its used bytes only: ETDump offsets
 *                                    index it from byte 0)
 *   --debug_buffer_size BYTES        default 100000000, as qnn_executor_runner
 *   --output_folder_path outputs     output_0_<i>.raw: the raw bytes of tensor output i (no header;
 *                                    dtype and shape come from the bundle), qnn_executor_runner's names
 *   --bundleio_rtol/--bundleio_atol  the device-side BundleIO check of that case (logged only)
 *
 * Exit status: 0 ran and wrote everything; 1 a refused command line or model; 3 the debug buffer was
 * too small (nothing written; the log line says how many bytes the case needs); SIGABRT for the
 * runtime's own ET_CHECK failures (missing operator, failed load, failed execution).
 *
 * Built from ExecuTorch's sources next to the executor_runner, with the same libraries:
 * firmware_scripts/android/build_executor_runner.sh --toolchain gnu --debug-runner.
 */

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <sys/types.h>

#include <gflags/gflags.h>

#include <executorch/devtools/bundled_program/bundled_program.h>
#include <executorch/devtools/etdump/data_sinks/data_sink_base.h>
#include <executorch/devtools/etdump/etdump_flatcc.h>
#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/event_tracer.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/runtime.h>

DEFINE_string(model_path, "model.bpte", "BundleIO program (.bpte) to run.");
DEFINE_string(method_name, "", "Method to run. If empty, the program's first method.");
DEFINE_int32(testset_idx, 0, "Index of the bundled test case whose inputs are run.");
DEFINE_string(
    prefix_testset_idx,
    "",
    "Comma-separated bundled test cases run first on the same loaded method, without intermediate logging.");
DEFINE_string(etdump_path, "etdump.etdp", "Write the ETDump to this path.");
DEFINE_bool(dump_intermediate_outputs, false, "Dump intermediate outputs to the debug buffer.");
DEFINE_string(debug_output_path, "debug_output.bin", "Write the debug buffer (its used bytes) to this path.");
DEFINE_int32(
    debug_buffer_size,
    100000000, // 100 MB, as qnn_executor_runner
    "Size of the debug buffer in bytes for the intermediate outputs.");
DEFINE_string(
    output_folder_path,
    "outputs",
    "Folder for output_0_<i>.raw, the raw bytes of each tensor output.");
DEFINE_double(bundleio_rtol, 0.01, "Relative tolerance of the device-side BundleIO check (logged only).");
DEFINE_double(bundleio_atol, 0.01, "Absolute tolerance of the device-side BundleIO check (logged only).");

using executorch::aten::Tensor;
using executorch::etdump::DataSinkBase;
using executorch::etdump::ETDumpGen;
using executorch::etdump::ETDumpResult;
using executorch::extension::BufferDataLoader;
using executorch::extension::MallocMemoryAllocator;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::EventTracerDebugLogLevel;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Span;

namespace {

constexpr int kExitDebugBufferOverflow = 3;
constexpr size_t kAlignment = 64; // BufferDataSink's default alignment

/**
 * The debug buffer as a data sink, like ETDumpGen::set_debug_buffer's BufferDataSink, with one
 * difference: when a tensor does not fit, it does not fail the write (ETDumpGen would abort with
 * "write_tensor_or_return_error() failed to write tensor to debug buffer" at the first one) but
 * keeps counting, so that after the run the runner can say how many bytes the case needs.
 */
class CountingBufferSink final : public DataSinkBase {
 public:
  CountingBufferSink(uint8_t* data, size_t size) : data_(data), size_(size) {}

  Result<size_t> write(const void* ptr, size_t length) override {
    size_t begin = (needed_ + kAlignment - 1) / kAlignment * kAlignment;
    size_t end = begin + length;
    needed_ = end;
    if (overflowed_ || end > size_) {
      if (!overflowed_) {
        overflowed_ = true;
        first_overflow_at_ = begin;
        first_overflow_len_ = length;
      }
      return static_cast<size_t>(0); // a placeholder offset: this ETDump is never written
    }
    if (length > 0) {
      memset(data_ + used_, 0, begin - used_);
      memcpy(data_ + begin, ptr, length);
    }
    used_ = end;
    return begin;
  }

  size_t get_used_bytes() const override {
    return used_;
  }

  bool overflowed() const {
    return overflowed_;
  }
  size_t needed() const {
    return needed_;
  }
  size_t first_overflow_at() const {
    return first_overflow_at_;
  }
  size_t first_overflow_len() const {
    return first_overflow_len_;
  }

 private:
  uint8_t* data_;
  size_t size_;
  size_t used_ = 0;
  size_t needed_ = 0;
  bool overflowed_ = false;
  size_t first_overflow_at_ = 0;
  size_t first_overflow_len_ = 0;
};

bool read_file(const std::string& path, std::vector<uint8_t>& out) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file.is_open()) {
    return false;
  }
  const std::streamsize n = file.tellg();
  if (n < 0) {
    return false;
  }
  file.seekg(0, std::ios::beg);
  out.resize(static_cast<size_t>(n));
  return n == 0 || static_cast<bool>(file.read(reinterpret_cast<char*>(out.data()), n));
}

// "3,0,12" -> {3, 0, 12}; false for anything else (an empty string is no prefix).
bool parse_indices(const std::string& text, std::vector<size_t>& out) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    out.push_back(static_cast<size_t>(std::stoul(item)));
    if (comma == std::string::npos) {
      break;
    }
    pos = comma + 1;
    if (pos == text.size()) {
      return false; // a trailing comma
    }
  }
  return true;
}

bool write_file(const std::string& path, const void* data, size_t size) {
  FILE* f = fopen(path.c_str(), "wb");
  if (f == nullptr) {
    ET_LOG(Error, "Cannot open %s for writing: %s", path.c_str(), strerror(errno));
    return false;
  }
  const size_t written = size ? fwrite(data, 1, size, f) : 0;
  const bool ok = written == size && fclose(f) == 0;
  if (!ok) {
    ET_LOG(Error, "Writing %zu bytes to %s failed: %s", size, path.c_str(), strerror(errno));
  }
  return ok;
}

} // namespace

int main(int argc, char** argv) {
  executorch::runtime::runtime_init();
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc != 1) {
    std::string msg = "Extra commandline args:";
    for (int i = 1; i < argc; i++) {
      msg += std::string(" ") + argv[i];
    }
    ET_LOG(Error, "%s", msg.c_str());
    return 1;
  }
  if (FLAGS_testset_idx < 0 || FLAGS_debug_buffer_size <= 0) {
    ET_LOG(Error, "--testset_idx must be >= 0 and --debug_buffer_size > 0");
    return 1;
  }
  std::vector<size_t> prefix;
  if (!parse_indices(FLAGS_prefix_testset_idx, prefix)) {
    ET_LOG(Error, "--prefix_testset_idx: expected comma-separated test case indices, got '%s'",
           FLAGS_prefix_testset_idx.c_str());
    return 1;
  }

  std::vector<uint8_t> file_data;
  if (!read_file(FLAGS_model_path, file_data)) {
    ET_LOG(Error, "Could not open file '%s'", FLAGS_model_path.c_str());
    return 1;
  }
  if (!executorch::bundled_program::is_bundled_program(file_data.data(), file_data.size())) {
    ET_LOG(
        Error,
        "%s is not a BundleIO program (.bpte): the debug runner runs the inputs of a bundled test case",
        FLAGS_model_path.c_str());
    return 1;
  }
  const void* program_data = nullptr;
  size_t program_data_len = 0;
  Error status = executorch::bundled_program::get_program_data(
      file_data.data(), file_data.size(), &program_data, &program_data_len);
  if (status != Error::Ok) {
    ET_LOG(Error, "Failed to parse model file %s (get_program_data: 0x%" PRIx32 ")",
           FLAGS_model_path.c_str(), static_cast<uint32_t>(status));
    return 1;
  }
  BufferDataLoader loader(program_data, program_data_len);
  Result<Program> program = Program::load(&loader);
  if (!program.ok()) {
    ET_LOG(Error, "Failed to parse model file %s", FLAGS_model_path.c_str());
    return 1;
  }
  ET_LOG(Info, "Model file %s is loaded.", FLAGS_model_path.c_str());

  std::string method_name = FLAGS_method_name;
  if (method_name.empty()) {
    const auto first = program->get_method_name(0);
    ET_CHECK_MSG(first.ok(), "Program has no methods");
    method_name = *first;
  }
  ET_LOG(Info, "Using method %s, test case %d", method_name.c_str(), FLAGS_testset_idx);
  Result<MethodMeta> method_meta = program->method_meta(method_name.c_str());
  ET_CHECK_MSG(
      method_meta.ok(),
      "Failed to get method_meta for %s: 0x%" PRIx32,
      method_name.c_str(),
      static_cast<uint32_t>(method_meta.error()));

  MallocMemoryAllocator method_allocator;
  MallocMemoryAllocator temp_allocator;
  std::vector<std::unique_ptr<uint8_t[]>> planned_buffers;
  std::vector<Span<uint8_t>> planned_spans;
  for (size_t id = 0; id < method_meta->num_memory_planned_buffers(); ++id) {
    const size_t size = static_cast<size_t>(method_meta->memory_planned_buffer_size(id).get());
    ET_LOG(Info, "Setting up planned buffer %zu, size %zu.", id, size);
    planned_buffers.push_back(std::make_unique<uint8_t[]>(size));
    planned_spans.push_back({planned_buffers.back().get(), size});
  }
  HierarchicalAllocator planned_memory({planned_spans.data(), planned_spans.size()});
  MemoryManager memory_manager(&method_allocator, &planned_memory, &temp_allocator);

  ETDumpGen etdump_gen;
  Result<Method> method = program->load_method(method_name.c_str(), &memory_manager, &etdump_gen);
  ET_CHECK_MSG(
      method.ok(),
      "Loading of method %s failed with status 0x%" PRIx32,
      method_name.c_str(),
      static_cast<uint32_t>(method.error()));
  ET_LOG(Info, "Method loaded.");

  // The earlier steps of a sequence first, on this loaded method, before any intermediate is logged.
  for (size_t k = 0; k < prefix.size(); ++k) {
    status = executorch::bundled_program::load_bundled_input(*method, file_data.data(), prefix[k]);
    if (status != Error::Ok) {
      ET_LOG(
          Error,
          "Cannot load the inputs of prefix test case %zu of method %s from the bundle: 0x%" PRIx32,
          prefix[k],
          method_name.c_str(),
          static_cast<uint32_t>(status));
      return 1;
    }
    status = method->execute();
    ET_CHECK_MSG(
        status == Error::Ok,
        "Execution of prefix test case %zu of method %s failed with status 0x%" PRIx32,
        prefix[k],
        method_name.c_str(),
        static_cast<uint32_t>(status));
  }
  if (!prefix.empty()) {
    ET_LOG(Info, "Ran %zu prefix test case(s) on the loaded method.", prefix.size());
  }

  const size_t buffer_size = static_cast<size_t>(FLAGS_debug_buffer_size);
  std::unique_ptr<uint8_t, decltype(&free)> debug_buffer(nullptr, &free);
  std::unique_ptr<CountingBufferSink> sink;
  if (FLAGS_dump_intermediate_outputs) {
    const size_t rounded = (buffer_size + kAlignment - 1) / kAlignment * kAlignment;
    debug_buffer.reset(static_cast<uint8_t*>(aligned_alloc(kAlignment, rounded)));
    if (!debug_buffer) {
      ET_LOG(Error, "Cannot allocate a debug buffer of %zu bytes", buffer_size);
      return 1;
    }
    sink = std::make_unique<CountingBufferSink>(debug_buffer.get(), buffer_size);
    etdump_gen.set_data_sink(sink.get());
    etdump_gen.set_event_tracer_debug_level(EventTracerDebugLogLevel::kIntermediateOutputs);
    ET_LOG(Info, "Debug buffer: %zu bytes; logging intermediate outputs.", buffer_size);
  }

  status = executorch::bundled_program::load_bundled_input(
      *method, file_data.data(), static_cast<size_t>(FLAGS_testset_idx));
  if (status != Error::Ok) {
    ET_LOG(
        Error,
        "Cannot load the inputs of test case %d of method %s from the bundle: 0x%" PRIx32,
        FLAGS_testset_idx,
        method_name.c_str(),
        static_cast<uint32_t>(status));
    return 1;
  }
  status = method->execute();
  ET_CHECK_MSG(
      status == Error::Ok,
      "Execution of method %s failed with status 0x%" PRIx32,
      method_name.c_str(),
      static_cast<uint32_t>(status));
  ET_LOG(Info, "Model executed successfully 1 time(s).");

  if (sink && sink->overflowed()) {
    ET_LOG(
        Error,
        "bundlerun debug buffer overflow: --debug_buffer_size %zu bytes is too small; the intermediate outputs of "
        "this case need %zu bytes (the first that did not fit: %zu bytes at offset %zu). Nothing was written.",
        buffer_size,
        sink->needed(),
        sink->first_overflow_len(),
        sink->first_overflow_at());
    return kExitDebugBufferOverflow;
  }

  std::vector<EValue> outputs(method->outputs_size());
  status = method->get_outputs(outputs.data(), outputs.size());
  ET_CHECK(status == Error::Ok);
  ET_LOG(Info, "%zu outputs: ", outputs.size());
  if (mkdir(FLAGS_output_folder_path.c_str(), 0755) != 0 && errno != EEXIST) {
    ET_LOG(Error, "Cannot create %s: %s", FLAGS_output_folder_path.c_str(), strerror(errno));
    return 1;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].isTensor()) {
      continue;
    }
    const Tensor tensor = outputs[i].toTensor();
    const std::string name = FLAGS_output_folder_path + "/output_0_" + std::to_string(i) + ".raw";
    ET_LOG(Info, "Writing output to file: %s", name.c_str());
    if (!write_file(name, tensor.const_data_ptr(), tensor.nbytes())) {
      return 1;
    }
  }

  ETDumpResult result = etdump_gen.get_etdump_data();
  if (result.buf == nullptr || result.size == 0) {
    ET_LOG(Error, "No ETDump data available!");
    return 1;
  }
  const bool etdump_ok = write_file(FLAGS_etdump_path, result.buf, result.size);
  free(result.buf);
  if (!etdump_ok) {
    return 1;
  }
  ET_LOG(Info, "ETDump written to file '%s'.", FLAGS_etdump_path.c_str());
  if (sink) {
    if (!write_file(FLAGS_debug_output_path, debug_buffer.get(), sink->get_used_bytes())) {
      return 1;
    }
    ET_LOG(
        Info,
        "Write debug output binary to %s, Size = %zu (of %zu)",
        FLAGS_debug_output_path.c_str(),
        sink->get_used_bytes(),
        buffer_size);
  }

  // The device-side BundleIO check of this case: information only (the host judges the outputs).
  executorch::bundled_program::ErrorStats stats = executorch::bundled_program::compute_method_output_error_stats(
      *method, file_data.data(), static_cast<size_t>(FLAGS_testset_idx));
  if (stats.status == Error::Ok) {
    ET_LOG(Info, "=== Error stats for testset %d ===", FLAGS_testset_idx);
    ET_LOG(Info, " mean_absolute_error: %f", stats.mean_abs_error);
    ET_LOG(Info, " max_absolute_error:  %f", stats.max_abs_error);
  }
  status = executorch::bundled_program::verify_method_outputs(
      *method, file_data.data(), static_cast<size_t>(FLAGS_testset_idx), FLAGS_bundleio_rtol, FLAGS_bundleio_atol);
  ET_LOG(
      Info,
      "TEST: BundleIO index[%d] Test_result: %s (rtol=%f atol=%f; not the exit status)",
      FLAGS_testset_idx,
      status == Error::Ok ? "PASS" : "FAIL",
      FLAGS_bundleio_rtol,
      FLAGS_bundleio_atol);
  return 0;
}
