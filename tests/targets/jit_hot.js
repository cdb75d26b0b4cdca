// A hot JS function and an allocating one, for perf-map tests (node --perf-basic-prof).
const seconds = Number(process.argv[2] || 2);
const keep = [];
function hotLoopFn(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s = (s * 31 + i) % 1000003;
  return s;
}
function leakyJsAlloc() {
  const b = Buffer.allocUnsafeSlow(8 * 1024);
  b[0] = 1;
  keep.push(b);
  if (keep.length > 100) keep.shift();
}
// A fixed number of calls (not a time), so it is compiled however busy the machine is.
for (let i = 0; i < 20000; i++) leakyJsAlloc();
// The hot loop runs for `seconds` of the process's CPU time, not wall time: on a busy
// machine a wall-clock loop gets less CPU while start-up and node's own threads cost the
// same, and the loop's share of the samples drifted below what the test expects.
const start = process.cpuUsage();
const cpuSeconds = () => {
  const used = process.cpuUsage(start);
  return (used.user + used.system) / 1e6;
};
let total = 0;
while (cpuSeconds() < seconds) total += hotLoopFn(1e6);
console.log(total, keep.length);
