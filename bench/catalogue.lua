-- wrk script of bench/catalogue.py: every request is the next path of a fixed mix, read from
-- the file named by the script's first argument (one path a line, query included); each wrk
-- thread starts at its own place in the mix and cycles through it. When the run ends, one line
-- "WRK_JSON {...}" with the figures bench/catalogue.py reads (latencies in microseconds).

local paths = {}
local position = 0
local threads = 0

function setup(thread)
  thread:set("thread_number", threads)
  threads = threads + 1
end

function init(args)
  for line in io.lines(args[1]) do
    if #line > 0 then
      paths[#paths + 1] = line
    end
  end
  if #paths == 0 then
    error("no request paths in " .. tostring(args[1]))
  end
  position = ((thread_number or 0) * 7919) % #paths
end

function request()
  position = position % #paths + 1
  return wrk.format("GET", paths[position])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "durationUs": %d, "bytes": %d, "connectErrors": %d, "readErrors": %d, '
      .. '"writeErrors": %d, "statusErrors": %d, "timeouts": %d, "p50Us": %d, "p99Us": %d, "maxUs": %d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max
  ))
end
