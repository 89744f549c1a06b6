-- hame-fs-remote: every mutation of one RedisFs namespace, the atomic read, and the
-- batched listing.
-- ARGV[1] = operation, ARGV[2] = key prefix ("<prefix>:{<namespace>}:"), ARGV[3] = write id
-- ('' for the read), then per operation (A[1], A[2], ... below).
-- A mutation that succeeds remembers its write id for 60 s (w:<id>, holding its reply's
-- generation): the same call sent again after its reply was lost with the connection finds
-- it and answers as the first run did, without applying it twice. Every error reply comes
-- before any change, so only successes are remembered.
-- Keys: f:<path> content (string), m:<path> meta (hash: v = sha-256 version when known,
-- g = generation, t = modified ms), d:<dir> children names (sorted set, score 0; Redis drops
-- it when empty, so a directory exists exactly while something lies below it), idx = every
-- file path (sorted set, score 0, for subtree range reads), gen = generation counter.
-- Every key shares the "{<namespace>}" hash tag, so one script touches one slot.
-- Replies are arrays of strings: {'ok', ...} or {<error code>, <path or reason>}.
local op = ARGV[1]
local P = ARGV[2]
local ID = ARGV[3]
local A = {}
for i = 4, #ARGV do A[#A + 1] = ARGV[i] end
local IDX = P .. 'idx'
local GEN = P .. 'gen'
local WKEY = P .. 'w:' .. ID
local REMEMBER_MS = 60000

-- A mutation already applied under this write id: its reply again.
if ID ~= '' then
  local done = redis.call('GET', WKEY)
  if done then
    if done == '' then return {'ok'} end
    return {'ok', done}
  end
end

-- The reply of a successful mutation (g: the generation it handed out, or nil),
-- remembered under the write id.
local function ok(g)
  if ID ~= '' then redis.call('SET', WKEY, g or '', 'PX', REMEMBER_MS) end
  if g then return {'ok', g} end
  return {'ok'}
end
local function fkey(p) return P .. 'f:' .. p end
local function mkey(p) return P .. 'm:' .. p end
local function dkey(p) return P .. 'd:' .. p end

local function split(p)
  local parent, name = string.match(p, '^(.*)/([^/]*)$')
  if parent then return parent, name end
  return '', p
end

-- Walks up from p: calls step(parent, name) for p's parent (name = the child's name in it),
-- then for that parent's parent, and so on, until step returns true (that parent is
-- returned) or the root has been passed (nil).
local function climb(p, step)
  local q = p
  while q ~= '' do
    local parent, name = split(q)
    if step(parent, name) then return parent end
    q = parent
  end
  return nil
end

-- The nearest proper ancestor of p that is a file, or nil.
local function file_ancestor(p)
  return climb(p, function(parent)
    return parent ~= '' and redis.call('EXISTS', fkey(parent)) == 1
  end)
end

-- Adds p to its parent's children, and so on up while a parent is new.
local function link(p)
  climb(p, function(parent, name)
    return redis.call('ZADD', dkey(parent), 0, name) == 0
  end)
end

-- Removes p from its parent's children, and so on up while a parent became empty.
local function unlink(p)
  climb(p, function(parent, name)
    redis.call('ZREM', dkey(parent), name)
    return parent == '' or redis.call('EXISTS', dkey(parent)) == 1
  end)
end

-- Checks before a file is created or replaced at p.
local function check_target(p)
  if redis.call('EXISTS', dkey(p)) == 1 then return {'is_directory', p} end
  local a = file_ancestor(p)
  if a then return {'not_a_directory', a} end
  return nil
end

if op == 'write' then
  -- 1 path, 2 mode (o overwrite | c create | v if version | g if generation), 3 expected,
  -- 4 data, 5 version of data, 6 now (ms)
  local p = A[1]
  local bad = check_target(p)
  if bad then return bad end
  local exists = redis.call('EXISTS', fkey(p)) == 1
  local mode = A[2]
  if mode == 'c' and exists then return {'already_exists', p} end
  if mode == 'v' or mode == 'g' then
    if not exists then return {'conflict', 'the file no longer exists'} end
    if mode == 'v' then
      local v = redis.call('HGET', mkey(p), 'v')
      if not v then return {'unknown'} end
      if v ~= A[3] then return {'conflict', 'the content is not the expected version'} end
    elseif redis.call('HGET', mkey(p), 'g') ~= A[3] then
      return {'conflict', 'the content changed since it was read'}
    end
  end
  redis.call('SET', fkey(p), A[4])
  local g = redis.call('INCR', GEN)
  redis.call('HSET', mkey(p), 'v', A[5], 'g', g, 't', A[6])
  redis.call('ZADD', IDX, 0, p)
  link(p)
  return ok(tostring(g))
elseif op == 'append' then
  -- 1 path, 2 data, 3 now (ms)
  local p = A[1]
  local bad = check_target(p)
  if bad then return bad end
  redis.call('APPEND', fkey(p), A[2])
  local g = redis.call('INCR', GEN)
  redis.call('HDEL', mkey(p), 'v')
  redis.call('HSET', mkey(p), 'g', g, 't', A[3])
  redis.call('ZADD', IDX, 0, p)
  link(p)
  return ok(tostring(g))
elseif op == 'read' then
  -- 1 path; returns content and generation in one step
  local p = A[1]
  local data = redis.call('GET', fkey(p))
  if not data then
    if redis.call('EXISTS', dkey(p)) == 1 then return {'is_directory', p} end
    return {'not_found', p}
  end
  return {'ok', data, redis.call('HGET', mkey(p), 'g') or ''}
elseif op == 'list' then
  -- A read: several listings at one moment. Per listing three arguments: path, recursive
  -- (1: every file below, from idx | 0: the children, from d:<path>), most entries ('': no
  -- cap). Reply per listing: 'ok', the number of entries, more (1 | 0: entries past the
  -- cap), then per entry path, kind (f | d), size, modified ms ('' when unknown); or an
  -- error code and the path.
  local out = {'ok'}
  for i = 1, #A, 3 do
    local p, rec, max = A[i], A[i + 1] == '1', tonumber(A[i + 2])
    if p ~= '' and redis.call('EXISTS', dkey(p)) == 0 then
      if redis.call('EXISTS', fkey(p)) == 1 then
        out[#out + 1] = 'not_a_directory'
      else
        out[#out + 1] = 'not_found'
      end
      out[#out + 1] = p
    else
      local limit = -1
      if max then limit = max + 1 end
      local names
      if rec then
        local lo, hi = '-', '+'
        if p ~= '' then lo, hi = '[' .. p .. '/', '(' .. p .. '0' end
        names = redis.call('ZRANGEBYLEX', IDX, lo, hi, 'LIMIT', 0, limit)
      else
        names = redis.call('ZRANGEBYLEX', dkey(p), '-', '+', 'LIMIT', 0, limit)
      end
      local more = '0'
      if max and #names > max then
        more = '1'
        names[#names] = nil
      end
      out[#out + 1] = 'ok'
      local count_at = #out + 1
      out[count_at] = '0'
      out[#out + 1] = more
      local n = 0
      for _, name in ipairs(names) do
        local c = name
        if not rec and p ~= '' then c = p .. '/' .. name end
        if redis.call('EXISTS', fkey(c)) == 1 then
          out[#out + 1] = c
          out[#out + 1] = 'f'
          out[#out + 1] = tostring(redis.call('STRLEN', fkey(c)))
          out[#out + 1] = redis.call('HGET', mkey(c), 't') or ''
          n = n + 1
        elseif not rec and redis.call('EXISTS', dkey(c)) == 1 then
          out[#out + 1] = c
          out[#out + 1] = 'd'
          out[#out + 1] = '0'
          out[#out + 1] = ''
          n = n + 1
        end
      end
      out[count_at] = tostring(n)
    end
  end
  return out
elseif op == 'delete' then
  -- 1 path of a file
  local p = A[1]
  if redis.call('EXISTS', fkey(p)) == 0 then return {'not_found', p} end
  redis.call('DEL', fkey(p), mkey(p))
  redis.call('ZREM', IDX, p)
  unlink(p)
  return ok()
elseif op == 'rename' then
  -- 1 from (a file), 2 to, 3 overwrite (1 | 0)
  local from, to = A[1], A[2]
  if redis.call('EXISTS', fkey(from)) == 0 then return {'not_found', from} end
  local bad = check_target(to)
  if bad then return bad end
  if A[3] ~= '1' and redis.call('EXISTS', fkey(to)) == 1 then return {'already_exists', to} end
  redis.call('RENAME', fkey(from), fkey(to))
  if redis.call('EXISTS', mkey(from)) == 1 then
    redis.call('RENAME', mkey(from), mkey(to))
  else
    redis.call('DEL', mkey(to))
  end
  redis.call('ZREM', IDX, from)
  redis.call('ZADD', IDX, 0, to)
  unlink(from)
  link(to)
  return ok()
end
return redis.error_reply('hame-fs-remote: unknown operation ' .. tostring(op))
