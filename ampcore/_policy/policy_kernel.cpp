// ampcore's compiled policy kernel: the C++ executor of the action table.
//
// One boxed kernel per castable ATen overload that some policy changes, on one autocast
// dispatch key (the key ampcore/_policy/registration.py chose; the other overloads have none
// there, so the dispatcher passes them by at no cost).  Per call it finds the client (device type) whose
// tensors the call is on and whose autocast is on, reads this thread's table id for that
// client (set from Python on region entry and exit), and carries out the op's code in that
// table: pass the call on, cast the tensor arguments, decompose, keep, ban.  The codes are
// decided in Python, once per policy (ampcore/_policy/compiled.py encodes the decisions of
// ampcore/_policy/kernels.py::decide); the Python executor carries out the same decisions.
// Built at first use by ampcore/_policy/executor.py (torch.utils.cpp_extension.load).

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using c10::DispatchKey;
using c10::DispatchKeySet;
using c10::IValue;
using torch::jit::Stack;

// -- codes: the action of one op under one policy (ampcore/_policy/compiled.py: CODES) -----
enum Code : uint8_t {
  PASS = 0,         // torch's own autocast kernel below does the same: after this key
  FOLLOW = 1,       // no cast: below autocast, this key off
  DESCEND = 2,      // a composite decomposed below autocast with this key on
  KEEP = 3,         // as called, every autocast key off
  BANNED = 4,       // raises
  LOW = 5,          // eligible tensors to the autocast dtype
  FP32 = 6,         // eligible tensors to float32
  PROMOTE = 7,      // eligible tensors to the widest eligible dtype
  SET_OPT_DTYPE = 8,  // dtype=float32 unless given
  APPEND_DTYPE = 9,   // the overload with a dtype argument, dtype float32
  AS_CALLED = 10,     // no cast, below autocast (a cast action's path with nothing to cast)
  THROUGH = 11,       // as if the kernel were not there (what the key's fallthrough does)
};
constexpr uint8_t kActionMask = 0x1f;
constexpr uint8_t kCheckFused = 0x20;  // before decomposing: warn (Python) if a fused kernel runs
constexpr uint8_t kChoose = 0x40;     // KEEP when the call passes a dtype
constexpr uint8_t kDecompose = 0x80;  // after casting, decompose under the inner table

constexpr int kMaxTables = 1 << 16;
constexpr int kMaxSlots = 32;

struct Table {
  std::vector<uint8_t> codes;  // per op index
  int32_t inner;               // the table inside a decomposed composite
  bool cache;                  // weight casts through torch's autocast cache
  mutable std::atomic<bool> warned{false};  // the fused-kernel warning was given (kCheckFused)
};

struct Client {
  DispatchKey autocast_key;  // excluded while its autocast is off
  DispatchKey backend_key;   // in the key set of a call on its tensors
  c10::DeviceType device_type;
  int slot;
  // a client that provides autocast (resident): autocast dtype -> table id, outside regions
  std::vector<std::pair<c10::ScalarType, int32_t>> provided;
};

struct Key {
  DispatchKey key;
  DispatchKeySet after;  // the key sets below this key
  DispatchKeySet below;  // ... and below every autocast key
  std::atomic<const std::vector<Client>*> clients{nullptr};  // replaced whole, never freed
  torch::Library* library = nullptr;                         // never freed: never removed
  std::vector<bool> registered;                              // per op index: has its kernel here
  size_t count = 0;                                          // how many have
};

struct Op {
  std::string name;
  int dtype_arg;  // position of its dtype argument, -1: none
  std::optional<c10::OperatorHandle> append_to;
  std::string banned;
  std::optional<c10::OperatorHandle> fused_choice;  // which kernel a call takes (kCheckFused)
  int64_t unfused = 0;                              // its value for the unfused path
};

std::array<std::atomic<const Table*>, kMaxTables> g_tables{};
std::atomic<int32_t> g_next_table{1};  // 0: no policy
std::vector<Op> g_ops;                 // set once, before any kernel is registered
std::vector<std::unique_ptr<Key>> g_keys;
DispatchKeySet g_autocast_keys;
std::mutex g_mutex;  // registration only
pybind11::object* g_warn = nullptr;  // Python: warn(op index, table id); never freed
thread_local std::array<int32_t, kMaxSlots> t_current{};
thread_local uint64_t t_entries = 0;  // kernel entries of this thread (tests count them)

bool eligible(const at::Tensor& t, c10::DeviceType device_type) {
  return t.defined() && t.is_floating_point() && t.scalar_type() != at::kDouble &&
         t.device().type() == device_type;
}

at::Tensor cast_tensor(const at::Tensor& t, at::ScalarType to, c10::DeviceType device_type, bool cache) {
  if (cache && t.requires_grad()) {  // torch's cached_cast: leaf float32 weights once per region
    at::Tensor cast = at::autocast::cached_cast(to, t, device_type);
    if (cast.scalar_type() == to) {
      return cast;
    }
  }
  return t.to(to);
}

bool needs_cast(const IValue& item, at::ScalarType to, c10::DeviceType device_type) {
  return item.isTensor() && eligible(item.toTensor(), device_type) && item.toTensor().scalar_type() != to;
}

// A list (Tensor[] or Tensor?[]) with its eligible tensors cast; the list itself when none
// needs a cast (int lists, lists already in ``to``): nothing is copied then.
void cast_list(IValue& value, at::ScalarType to, c10::DeviceType device_type, bool cache) {
  const auto items = value.toListRef();
  if (std::none_of(items.begin(), items.end(), [&](const IValue& item) { return needs_cast(item, to, device_type); })) {
    return;
  }
  c10::impl::GenericList cast(value.toList().elementType());
  for (const IValue& item : items) {
    cast.push_back(needs_cast(item, to, device_type) ? IValue(cast_tensor(item.toTensor(), to, device_type, cache)) : item);
  }
  value = IValue(std::move(cast));
}

// Every eligible tensor among the call's arguments (also in lists) cast to ``to``.
void cast_arguments(Stack* stack, size_t count, at::ScalarType to, c10::DeviceType device_type, bool cache) {
  for (size_t i = stack->size() - count; i < stack->size(); ++i) {
    IValue& value = (*stack)[i];
    if (value.isTensor()) {
      if (needs_cast(value, to, device_type)) {
        value = cast_tensor(value.toTensor(), to, device_type, cache);
      }
    } else if (value.isList()) {  // Tensor[], Tensor?[] (and int lists, left alone)
      cast_list(value, to, device_type, cache);
    }
  }
}

void widen(const at::Tensor& t, c10::DeviceType device_type, std::optional<at::ScalarType>& widest) {
  if (eligible(t, device_type)) {
    widest = widest ? at::promote_types(*widest, t.scalar_type()) : t.scalar_type();
  }
}

// torch's promote_type: the widest dtype among the eligible inputs (a third floating dtype
// promotes as torch.promote_types does, where torch raises).
std::optional<at::ScalarType> widest_of(const Stack* stack, size_t count, c10::DeviceType device_type) {
  std::optional<at::ScalarType> widest;
  for (size_t i = stack->size() - count; i < stack->size(); ++i) {
    const IValue& value = (*stack)[i];
    if (value.isTensor()) {
      widen(value.toTensor(), device_type, widest);
    } else if (value.isList()) {  // Tensor[], Tensor?[]
      for (const IValue& item : value.toListRef()) {
        if (item.isTensor()) widen(item.toTensor(), device_type, widest);
      }
    }
  }
  return widest;
}

struct CurrentTable {  // the thread's table of a slot, restored on scope exit
  int slot;
  int32_t saved;
  CurrentTable(int slot_, int32_t id) : slot(slot_), saved(t_current[slot_]) { t_current[slot_] = id; }
  ~CurrentTable() { t_current[slot] = saved; }
};

// A composite whose fused kernel may swallow custom-listed ops: when this call takes it, the
// warning (once per table) is given by Python, which names the ops and the way out.
void check_fused(const Op& info, int32_t table_id, const Table& table, const Stack* stack, size_t count) {
  Stack args(stack->end() - count, stack->end());
  info.fused_choice->callBoxed(&args);
  if (args.at(0).toInt() == info.unfused || g_warn == nullptr) {
    return;
  }
  table.warned.store(true, std::memory_order_relaxed);
  pybind11::gil_scoped_acquire gil;
  (*g_warn)(static_cast<int64_t>(&info - g_ops.data()), table_id);
}

void cast_and_call(const Key& key, const Client& client, const Table& table, uint8_t code, const Op& info,
                   const c10::OperatorHandle& op, DispatchKeySet ks, Stack* stack) {
  const size_t count = op.schema().arguments().size();
  const uint8_t action = code & kActionMask;
  {
    // torch's kernel excludes its device's autocast key while it casts and calls the op;
    // this key goes too, or the casts would come back here
    c10::impl::ExcludeDispatchKeyGuard off(DispatchKeySet(key.key) | DispatchKeySet(client.autocast_key));
    if (action == LOW) {
      cast_arguments(stack, count, at::autocast::get_autocast_dtype(client.device_type), client.device_type, table.cache);
    } else if (action == FP32) {
      cast_arguments(stack, count, at::kFloat, client.device_type, false);
    } else if (action == PROMOTE) {
      std::optional<at::ScalarType> widest = widest_of(stack, count, client.device_type);
      if (widest) cast_arguments(stack, count, *widest, client.device_type, false);
    } else if (action == SET_OPT_DTYPE) {
      const size_t base = stack->size() - count;
      const IValue& first = (*stack)[base];
      if (info.dtype_arg >= 0 && first.isTensor() && eligible(first.toTensor(), client.device_type) &&
          (*stack)[base + info.dtype_arg].isNone()) {
        (*stack)[base + info.dtype_arg] = IValue(static_cast<int64_t>(at::kFloat));
      }
    }
    if (!(code & kDecompose)) {
      op.redispatchBoxed(ks & key.below, stack);
      return;
    }
  }
  const int32_t current = t_current[client.slot];
  if ((code & kCheckFused) && !table.warned.load(std::memory_order_relaxed)) {
    check_fused(info, current, table, stack, count);
  }
  CurrentTable inner(client.slot, table.inner ? table.inner : current);
  op.redispatchBoxed(ks & key.below, stack);
}

void append_dtype(const Client& client, const Op& info, const c10::OperatorHandle& op, Stack* stack) {
  const size_t count = op.schema().arguments().size();
  const IValue& first = (*stack)[stack->size() - count];
  at::ScalarType dtype = at::kFloat;
  if (first.isTensor() && !eligible(first.toTensor(), client.device_type)) {
    dtype = first.toTensor().scalar_type();
  }
  stack->emplace_back(static_cast<int64_t>(dtype));
  c10::impl::ExcludeDispatchKeyGuard off(g_autocast_keys);
  info.append_to->callBoxed(stack);
}

const Table* table_for(const Client& client) {
  int32_t id = t_current[client.slot];
  if (id == 0 && !client.provided.empty()) {  // a resident client outside any region: the O1 lists
    const at::ScalarType dtype = at::autocast::get_autocast_dtype(client.device_type);
    for (const auto& entry : client.provided) {
      if (entry.first == dtype) id = entry.second;
    }
  }
  return id == 0 ? nullptr : g_tables[id].load(std::memory_order_acquire);
}

void run(const Key& key, size_t index, const c10::OperatorHandle& op, DispatchKeySet ks, Stack* stack) {
  ++t_entries;
  const Client* client = nullptr;
  for (const Client& candidate : *key.clients.load(std::memory_order_acquire)) {
    if (ks.has(candidate.backend_key) && !c10::impl::tls_is_dispatch_key_excluded(candidate.autocast_key)) {
      client = &candidate;
      break;
    }
  }
  const Table* table = client == nullptr ? nullptr : table_for(*client);
  if (table == nullptr) {  // no policy: on below this key, as if the kernel were not there
    op.redispatchBoxed(ks & key.after, stack);
    return;
  }
  const Op& info = g_ops[index];
  uint8_t code = table->codes[index];
  if (code & kChoose) {
    const size_t base = stack->size() - op.schema().arguments().size();
    code = (info.dtype_arg >= 0 && !(*stack)[base + info.dtype_arg].isNone()) ? KEEP : (code & ~kChoose);
  }
  switch (code & kActionMask) {
    case PASS: {  // torch's kernel calls the op again: not through here
      c10::impl::ExcludeDispatchKeyGuard off(key.key);
      op.redispatchBoxed(ks & key.after, stack);
      return;
    }
    case THROUGH:  // exactly what the dispatcher does for an op without a kernel here
      op.redispatchBoxed(ks & key.after, stack);
      return;
    case FOLLOW: {
      c10::impl::ExcludeDispatchKeyGuard off(key.key);
      op.redispatchBoxed(ks & key.below, stack);
      return;
    }
    case DESCEND:
      op.redispatchBoxed(ks & key.below, stack);
      return;
    case KEEP: {
      c10::impl::ExcludeDispatchKeyGuard off(g_autocast_keys);
      op.callBoxed(stack);
      return;
    }
    case BANNED:
      TORCH_CHECK(false, info.banned);
    case APPEND_DTYPE:
      append_dtype(*client, info, op, stack);
      return;
    default:
      cast_and_call(key, *client, *table, code, info, op, ks, stack);
  }
}

class PolicyKernel final : public c10::OperatorKernel {
 public:
  PolicyKernel(const Key* key, size_t index) : key_(key), index_(index) {}
  void operator()(const c10::OperatorHandle& op, DispatchKeySet ks, Stack* stack) {
    run(*key_, index_, op, ks, stack);
  }

 private:
  const Key* key_;
  size_t index_;
};

// -- the Python side (ampcore/_policy/compiled.py) -----------------------------------------

c10::OperatorHandle find_op(const std::string& overload) {  // "name.overload" or "name"
  const auto dot = overload.find('.');
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      ("aten::" + overload.substr(0, dot)).c_str(), dot == std::string::npos ? "" : overload.substr(dot + 1).c_str());
}

void set_ops(const std::vector<std::string>& names, const std::vector<int>& dtype_args,
             const std::vector<std::string>& append_to, const std::vector<std::string>& banned,
             const std::vector<std::pair<std::string, int64_t>>& fused_choice, uint64_t autocast_keys,
             const pybind11::object& warn) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(g_ops.empty() || g_ops.size() == names.size(), "ampcore: the op list is set once per process");
  if (!g_ops.empty()) return;
  g_autocast_keys = DispatchKeySet(DispatchKeySet::RAW, autocast_keys);
  std::vector<Op> ops;
  for (size_t i = 0; i < names.size(); ++i) {
    Op op{names[i], dtype_args[i], std::nullopt, banned[i], std::nullopt, fused_choice[i].second};
    if (!append_to[i].empty()) op.append_to = find_op(append_to[i]);
    if (!fused_choice[i].first.empty()) op.fused_choice = find_op(fused_choice[i].first);
    ops.push_back(std::move(op));
  }
  g_ops = std::move(ops);
  g_warn = new pybind11::object(warn);
}

int add_key(int64_t key) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto entry = std::make_unique<Key>();
  entry->key = static_cast<DispatchKey>(key);
  entry->after = DispatchKeySet(DispatchKeySet::FULL_AFTER, entry->key);
  entry->below = entry->after - g_autocast_keys;
  entry->clients.store(new std::vector<Client>());
  g_keys.push_back(std::move(entry));
  return static_cast<int>(g_keys.size() - 1);
}

// Registers the kernels of the ops at ``indices`` on the key (those it has are skipped);
// returns how many ops have one there.  A kernel replaces the key's fallthrough for its op:
// the dispatcher writes the op's table entry before it clears the op's fallthrough bit for
// the key, and a call reads the entry only when that bit is clear, so a thread dispatching
// the op meanwhile takes either the fallthrough or the complete kernel.
size_t register_ops(int key_id, const std::vector<int64_t>& indices) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Key& key = *g_keys.at(key_id);
  if (key.library == nullptr) {
    key.library = new torch::Library(torch::Library::IMPL, "aten", key.key, __FILE__, __LINE__);
    key.registered.assign(g_ops.size(), false);
  }
  for (const int64_t index : indices) {
    const auto i = static_cast<size_t>(index);
    TORCH_CHECK(i < g_ops.size(), "ampcore: no op ", index);
    if (key.registered[i] || g_ops[i].name.empty()) continue;  // empty: its Python kernel runs (PYTHON_ROUTED)
    key.library->impl(g_ops[i].name.c_str(),
                      torch::CppFunction::makeFromBoxedFunctor(std::make_unique<PolicyKernel>(&key, i)));
    key.registered[i] = true;
    ++key.count;
  }
  return key.count;
}

// Sets the key's clients (highest-priority device key first); the previous list is leaked on
// purpose, since a kernel in another thread may still be reading it.
using ClientSpec = std::tuple<int64_t, int64_t, std::string, int, std::vector<std::pair<std::string, int32_t>>>;

c10::ScalarType scalar_type(const std::string& name) {  // "BFloat16", "Half"
  for (c10::ScalarType dtype : {at::kHalf, at::kBFloat16, at::kFloat}) {
    if (name == c10::toString(dtype)) return dtype;
  }
  TORCH_CHECK(false, "ampcore: no autocast dtype ", name);
}

void set_clients(int key_id, const std::vector<ClientSpec>& clients) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto* list = new std::vector<Client>();
  for (const auto& [autocast_key, backend_key, device_type, slot, provided] : clients) {
    TORCH_CHECK(slot >= 0 && slot < kMaxSlots, "ampcore: too many device types for the compiled kernel");
    Client client{static_cast<DispatchKey>(autocast_key), static_cast<DispatchKey>(backend_key),
                  c10::Device(device_type).type(), slot, {}};
    for (const auto& [dtype, id] : provided) client.provided.emplace_back(scalar_type(dtype), id);
    list->push_back(std::move(client));
  }
  g_keys.at(key_id)->clients.store(list, std::memory_order_release);
}

int32_t new_table(const pybind11::bytes& codes, int32_t inner, bool cache) {
  const int32_t id = g_next_table.fetch_add(1);
  TORCH_CHECK(id < kMaxTables, "ampcore: more than ", kMaxTables - 1, " op policies in one process");
  std::string raw = codes;
  TORCH_CHECK(raw.size() == g_ops.size(), "ampcore: a table has one code per op");
  g_tables[id].store(new Table{std::vector<uint8_t>(raw.begin(), raw.end()), inner, cache}, std::memory_order_release);
  return id;
}

// -- a region's entry and exit in one call each (ampcore/_policy/entry.py) ----------------
//
// What torch.autocast's __enter__ sets (enabled, dtype, nesting, weight-cast cache), the
// shadow key switched on for the thread and the thread's table for the slot; the previous
// state comes back packed in one integer for leave(), which restores it as __exit__ does
// (the weight-cast cache dropped when the outermost autocast exits).  A region's arguments
// are registered once (add_entry) and named by an id, so that each way is one call of a
// single argument or two.  No key (-1): the shadow key is left alone; no slot (-1): the
// thread's tables are left alone (a region without a policy entered where none is in force).
constexpr int64_t kBits = 32;
constexpr int kMaxEntries = 4096;

struct Entry {
  c10::DeviceType device_type;
  at::ScalarType dtype;
  bool enabled;
  int cache;  // -1: keep torch's weight-cast cache setting
  int slot;   // -1: no table
  int32_t table;
  int64_t key;  // -1: no key
};

std::array<Entry, kMaxEntries> g_entries{};
std::atomic<int> g_next_entry{0};
std::mutex g_entries_lock;

int add_entry(int64_t device_type, int64_t dtype, bool enabled, int cache, int slot, int32_t table,
              int64_t key) {
  TORCH_CHECK(slot >= -1 && slot < kMaxSlots, "ampcore: no slot ", slot);
  std::lock_guard<std::mutex> guard(g_entries_lock);
  const int id = g_next_entry.load();
  if (id >= kMaxEntries) return -1;  // the caller enters the long way
  g_entries[id] = Entry{static_cast<c10::DeviceType>(device_type), static_cast<at::ScalarType>(dtype), enabled,
                        cache, slot, table, key};
  g_next_entry.store(id + 1, std::memory_order_release);
  return id;
}

const Entry& entry_of(int id) {
  TORCH_CHECK(id >= 0 && id < g_next_entry.load(std::memory_order_acquire), "ampcore: no region entry ", id);
  return g_entries[id];
}

int64_t enter(int id) {
  const Entry& e = entry_of(id);
  int64_t saved = e.slot >= 0 ? static_cast<uint32_t>(t_current[e.slot]) : 0;
  saved |= static_cast<int64_t>(at::autocast::is_autocast_enabled(e.device_type)) << kBits;
  saved |= static_cast<int64_t>(at::autocast::is_autocast_cache_enabled()) << (kBits + 1);
  saved |= static_cast<int64_t>(at::autocast::get_autocast_dtype(e.device_type)) << (kBits + 8);
  if (e.key >= 0) {
    const auto k = static_cast<DispatchKey>(e.key);
    saved |= static_cast<int64_t>(c10::impl::tls_is_dispatch_key_included(k)) << (kBits + 2);
    saved |= static_cast<int64_t>(c10::impl::tls_is_dispatch_key_excluded(k)) << (kBits + 3);
    c10::impl::tls_set_dispatch_key_included(k, true);
    c10::impl::tls_set_dispatch_key_excluded(k, false);
  }
  at::autocast::set_autocast_enabled(e.device_type, e.enabled);
  at::autocast::set_autocast_dtype(e.device_type, e.dtype);
  at::autocast::increment_nesting();
  if (e.cache >= 0) at::autocast::set_autocast_cache_enabled(e.cache != 0);
  if (e.slot >= 0) t_current[e.slot] = e.table;
  return saved;
}

void leave(int id, int64_t saved) {
  const Entry& e = entry_of(id);
  if (e.slot >= 0) t_current[e.slot] = static_cast<int32_t>(static_cast<uint32_t>(saved & 0xffffffff));
  if (at::autocast::decrement_nesting() == 0) {
    // Without the GIL, as torch.clear_autocast_cache: another thread in cached_cast holds the
    // cache's mutex and may wait for the GIL (a Python dispatch mode runs its cast).
    pybind11::gil_scoped_release no_gil;
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_enabled(e.device_type, (saved >> kBits) & 1);
  at::autocast::set_autocast_dtype(e.device_type, static_cast<at::ScalarType>((saved >> (kBits + 8)) & 0xff));
  at::autocast::set_autocast_cache_enabled((saved >> (kBits + 1)) & 1);
  if (e.key >= 0) {
    const auto k = static_cast<DispatchKey>(e.key);
    c10::impl::tls_set_dispatch_key_included(k, (saved >> (kBits + 2)) & 1);
    c10::impl::tls_set_dispatch_key_excluded(k, (saved >> (kBits + 3)) & 1);
  }
}

int64_t device_type_id(const std::string& device_type) { return static_cast<int64_t>(c10::Device(device_type).type()); }
int64_t scalar_type_id(const std::string& name) { return static_cast<int64_t>(scalar_type(name)); }

void set_current(int slot, int32_t id) { t_current.at(slot) = id; }
int32_t current(int slot) { return t_current.at(slot); }
uint64_t entries() { return t_entries; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_ops", &set_ops);
  m.def("add_key", &add_key);
  m.def("register_ops", &register_ops);
  m.def("set_clients", &set_clients);
  m.def("new_table", &new_table);
  m.def("set_current", &set_current);
  m.def("add_entry", &add_entry);
  m.def("enter", &enter);
  m.def("leave", &leave);
  m.def("device_type_id", &device_type_id);
  m.def("scalar_type_id", &scalar_type_id);
  m.def("current", &current);
  m.def("entries", &entries);
  m.attr("CODES") = pybind11::dict(
      pybind11::arg("pass") = static_cast<int>(PASS), pybind11::arg("follow") = static_cast<int>(FOLLOW),
      pybind11::arg("descend") = static_cast<int>(DESCEND), pybind11::arg("keep") = static_cast<int>(KEEP),
      pybind11::arg("banned") = static_cast<int>(BANNED), pybind11::arg("low") = static_cast<int>(LOW),
      pybind11::arg("fp32") = static_cast<int>(FP32), pybind11::arg("promote") = static_cast<int>(PROMOTE),
      pybind11::arg("fp32_set_opt_dtype") = static_cast<int>(SET_OPT_DTYPE),
      pybind11::arg("fp32_append_dtype") = static_cast<int>(APPEND_DTYPE),
      pybind11::arg("as_called") = static_cast<int>(AS_CALLED), pybind11::arg("through") = static_cast<int>(THROUGH),
      pybind11::arg("choose") = static_cast<int>(kChoose),
      pybind11::arg("decompose") = static_cast<int>(kDecompose),
      pybind11::arg("check_fused") = static_cast<int>(kCheckFused));
}
