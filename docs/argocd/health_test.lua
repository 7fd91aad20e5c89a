-- Runs health.lua the way Argo CD does (the resource as the global `obj`) against sample
-- GpuRemediationPolicy statuses, as the controller writes them. `lua5.4 health_test.lua` from
-- this directory, or `make argocd-health-test`; exits non-zero on the first wrong answer.
local here = arg[0]:match("(.*/)") or "./"

local function health(obj)
  local env = { obj = obj, ipairs = ipairs, pairs = pairs }
  local chunk = assert(loadfile(here .. "health.lua", "t", env))
  return chunk()
end

local function condition(type_, status, message)
  return { type = type_, status = status, reason = type_, message = message }
end

local function policy(generation, status)
  return { metadata = { name = "gpus", generation = generation }, status = status }
end

local cases = {
  { "a policy the controller has not seen yet is Progressing",
    policy(1, nil), "Progressing" },
  { "a spec newer than the status is Progressing",
    policy(3, { observedGeneration = 2, conditions = { condition("Ready", "True", "enforcing") } }),
    "Progressing" },
  { "an invalid policy is Degraded with the controller's message",
    policy(1, { observedGeneration = 1, conditions = {
      condition("Ready", "False", "invalid"),
      condition("Invalid", "True", "spec.safety.rate.limit: must be at least 1") } }),
    "Degraded", "spec.safety.rate.limit: must be at least 1" },
  { "an open circuit breaker is Degraded",
    policy(1, { observedGeneration = 1, conditions = {
      condition("Ready", "True", "enforcing"),
      condition("CircuitOpen", "True", "4 of 10 nodes unhealthy, above maxUnhealthy 10%") } }),
    "Degraded", "4 of 10 nodes unhealthy, above maxUnhealthy 10%" },
  { "a paused policy is Suspended",
    policy(1, { observedGeneration = 1, conditions = {
      condition("Ready", "True", "enforcing"),
      condition("CircuitOpen", "False", "0 of 10 nodes unhealthy"),
      condition("Paused", "True", "spec.paused is set") } }),
    "Suspended" },
  { "a ready policy is Healthy, whatever Overlap says",
    policy(1, { observedGeneration = 1, conditions = {
      condition("Ready", "True", "enforcing in mode Enforce"),
      condition("CircuitOpen", "False", "0 of 10 nodes unhealthy"),
      condition("Paused", "False", "not paused"),
      condition("Overlap", "True", "some nodes are governed by another policy") } }),
    "Healthy", "enforcing in mode Enforce" },
  { "a status without Ready is Progressing",
    policy(1, { observedGeneration = 1, conditions = {} }), "Progressing" },
}

local failed = 0
for _, case in ipairs(cases) do
  local name, obj, want, want_message = case[1], case[2], case[3], case[4]
  local got = health(obj)
  local ok = got.status == want and (want_message == nil or got.message == want_message)
  print((ok and "ok   " or "FAIL ") .. name .. ": " .. got.status .. " (" .. tostring(got.message) .. ")")
  if not ok then failed = failed + 1 end
end
if failed > 0 then
  print(failed .. " of " .. #cases .. " cases failed")
  os.exit(1)
end
print(#cases .. " cases passed")
