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
const end = Date.now() + seconds * 1000;
let total = 0;
while (Date.now() < end) total += hotLoopFn(1e6);
console.log(total, keep.length);
