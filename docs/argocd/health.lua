-- Argo CD health check for gpuremediation.dev/GpuRemediationPolicy.
-- Install: argocd-cm, key `resource.customizations.health.gpuremediation.dev_GpuRemediationPolicy`.
local hs = {}
if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for gpu-remediator to observe the policy"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= nil
    and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for gpu-remediator to observe the latest spec"
  return hs
end
local conditions = {}
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    conditions[c.type] = c
  end
end
local function holds(kind)
  return conditions[kind] ~= nil and conditions[kind].status == "True"
end
if holds("Invalid") then
  hs.status = "Degraded"
  hs.message = conditions["Invalid"].message
  return hs
end
if holds("CircuitOpen") then
  hs.status = "Degraded"
  hs.message = conditions["CircuitOpen"].message
  return hs
end
if holds("Paused") then
  hs.status = "Suspended"
  hs.message = conditions["Paused"].message
  return hs
end
if holds("Ready") then
  hs.status = "Healthy"
  hs.message = conditions["Ready"].message
  return hs
end
hs.status = "Progressing"
hs.message = "Waiting for the Ready condition"
return hs
