--[[ The testbed clusters' job_submit plugin (installed as /etc/slurm-CLUSTER/job_submit.lua,
with CLUSTER put in below; slurm.conf JobSubmitPlugins=lua): an account's submit limit,
refused as SLURM words one, without slurmdbd. Opt-in: only while
/etc/slurm-CLUSTER/job-limit holds a number N (the integration test
tests/integration/test_limits.py writes and removes it) is a job refused whose user
already holds N jobs (pending or running). Without the file nothing changes.
And while /etc/slurm-CLUSTER/submit-busy exists, every job is refused as a busy
controller refuses it ("Resource temporarily unavailable"): the same words over
sbatch and slurmrestd, for tests that need a site's submissions to fail for a while. ]]

local LIMIT_FILE = "/etc/slurm-CLUSTER/job-limit"
local BUSY_FILE = "/etc/slurm-CLUSTER/submit-busy"
-- EAGAIN: slurm_strerror's "Resource temporarily unavailable"
local BUSY = 11
-- ESLURM_ACCOUNTING_POLICY: "Job violates accounting/QOS policy (job submit limit, ...)"
local POLICY = slurm.ESLURM_ACCOUNTING_POLICY or 2050

local function limit()
    local f = io.open(LIMIT_FILE, "r")
    if f == nil then return nil end
    local n = tonumber(f:read("*l") or "")
    f:close()
    return n
end

-- slurm.jobs is rebuilt (a new table) only when a job changed in a later second than
-- the last rebuild: a burst within one second sees the same table, without the jobs it
-- has just accepted. So the jobs accepted since the table last changed are counted here.
local seen_table = nil
local unseen = {}

local function held(user_id)
    if slurm.jobs ~= seen_table then
        seen_table = slurm.jobs
        unseen = {}
    end
    local n = unseen[user_id] or 0
    for _, job in pairs(slurm.jobs or {}) do
        -- base state (low byte): 0 pending, 1 running, 2 suspended
        if job.user_id == user_id and (job.job_state % 256) < 3 then n = n + 1 end
    end
    return n
end

local function busy()
    local f = io.open(BUSY_FILE, "r")
    if f == nil then return false end
    f:close()
    return true
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    if busy() then
        slurm.log_info("job_submit.lua: refused a job as busy (%s)", BUSY_FILE)
        slurm.log_user("Slurm temporarily unavailable (test)")
        return BUSY
    end
    local ok, n = pcall(limit)
    if not ok or n == nil then return slurm.SUCCESS end
    local ok2, jobs = pcall(held, job_desc.user_id)
    if ok2 and jobs >= n then
        slurm.log_info("job_submit.lua: refused a job of uid %u: %d jobs held, limit %d",
                       job_desc.user_id, jobs, n)
        slurm.log_user("QOSMaxSubmitJobPerUserLimit")
        return POLICY
    end
    if ok2 then unseen[job_desc.user_id] = (unseen[job_desc.user_id] or 0) + 1 end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
