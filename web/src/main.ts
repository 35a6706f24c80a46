// The sbx dashboard: a single page routed by the URL's fragment
// (#/sandboxes, #/sandbox/ID, #/images, #/volumes, #/codebases, #/events).
import "./style.css";
import { h, clear } from "./dom";
import { sandboxes, setOnUnauthenticated, setToken, token, errText } from "./api";
import { sandboxesPage } from "./sandboxes";
import { sandboxPage } from "./sandbox";
import { imagesPage, volumesPage, codebasesPage, eventsPage } from "./lists";

// A page fills main and returns what stops it (timers, streams).
export type Page = (main: HTMLElement) => () => void;

const app = document.getElementById("app")!;
let stop: () => void = () => {};

function loginPage(message = ""): void {
  stop();
  stop = () => {};
  clear(app);
  const input = h("input", { type: "password", id: "token", autocomplete: "current-password", placeholder: "API token" });
  const err = h("p", { class: "error", id: "login-error" }, message);
  const form = h("form", { id: "login", class: "login" },
    h("h1", {}, "sbx"),
    h("label", { for: "token" }, "Token (sbx serve --auth-token-file)"),
    input,
    h("button", { type: "submit" }, "Log in"),
    err);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setToken(input.value.trim());
    try {
      await sandboxes.version({});
      location.hash = "#/sandboxes";
      route();
    } catch (e) {
      setToken("");
      err.textContent = "Refused: " + errText(e);
    }
  });
  app.appendChild(form);
  input.focus();
}

const nav: [string, string][] = [
  ["#/sandboxes", "Sandboxes"],
  ["#/images", "Images"],
  ["#/volumes", "Volumes"],
  ["#/codebases", "Codebases"],
  ["#/events", "Events"],
];

function route(): void {
  stop();
  stop = () => {};
  const hash = location.hash || "#/sandboxes";
  clear(app);
  const main = h("main", {});
  const logout = h("button", { class: "link", id: "logout" }, "Log out");
  logout.addEventListener("click", () => {
    setToken("");
    loginPage();
  });
  app.appendChild(h("header", {},
    h("a", { href: "#/sandboxes", class: "brand" }, "sbx"),
    h("nav", {}, ...nav.map(([href, text]) => h("a", { href, class: hash.startsWith(href) ? "active" : "" }, text))),
    token() ? logout : null));
  app.appendChild(main);
  let page: Page;
  const m = /^#\/sandbox\/([^/]+)$/.exec(hash);
  if (m) page = (el) => sandboxPage(el, decodeURIComponent(m[1]));
  else if (hash.startsWith("#/images")) page = imagesPage;
  else if (hash.startsWith("#/volumes")) page = volumesPage;
  else if (hash.startsWith("#/codebases")) page = codebasesPage;
  else if (hash.startsWith("#/events")) page = eventsPage;
  else page = sandboxesPage;
  stop = page(main);
}

setOnUnauthenticated(() => loginPage("The daemon refused the token: log in again."));
window.addEventListener("hashchange", route);

// A daemon without a token (loopback, single user) answers without one.
sandboxes.version({}).then(route, () => loginPage());
